# SPDX-License-Identifier: Apache-2.0
"""What the ucx extra exposes to a raw UCP client on the network (README "Security and threat model").

The client (tests/ucx_raw_client.c, compiled here against the libucx-cu12 wheel) runs in a second
network namespace, as another host would. It knows no token, link or descriptor: it scans every
port of the victim's address, forges a worker address for each open one, connects, and gets/puts
with an rkey made from its own memory at (a) heap memory kvblocks never registered, (b) a registered
cache, (c) address 0x10. UCX's software RMA (tcp, shared memory) checks no address against a
registration, so whatever worker it reaches is readable and writable whole: kvblocks starts one only
under kvblocks.UcxTrustedNetwork=1, bound to the link's interface, for a linked UCX peer.
Every victim sets kvblocks.AuthToken."""
import os
import subprocess

import pytest

from peer import pattern
from procs import Peer, read_process_memory
from test_two_hosts import two_hosts  # noqa: F401  (fixture)
from ucx_env import ucx_available

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "exposure-test-token"
SECRET = bytes(range(0x80, 0xC0))  # 64 bytes no scan of zeroed memory returns by chance
TRUSTED = "kvblocks.UcxTrustedNetwork"

pytestmark = pytest.mark.skipif(not ucx_available(), reason="the ucx extra (kvblocks-ucx) is not installed")


@pytest.fixture(scope="module")
def raw_client(tmp_path_factory):
    """The raw client, built against the headers and libraries of the libucx-cu12 wheel."""
    import libucx  # the ucx extra's dependency

    root = os.path.dirname(libucx.__file__)
    inc, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    exe = str(tmp_path_factory.mktemp("ucx") / "ucx_raw_client")
    subprocess.run(["cc", "-O1", "-o", exe, os.path.join(HERE, "ucx_raw_client.c"), f"-I{inc}", f"-L{lib}",
                    "-lucp", "-lucs", f"-Wl,-rpath,{lib}"], check=True)
    return exe


def _victim(ns, listen, transport, trusted=False):
    options = {TRUSTED: "1"} if trusted else None
    return Peer(1, listen=listen, transport=transport, auth=TOKEN, prefix=("ip", "netns", "exec", ns),
                options=options)


def _attack(raw_client, ns, ip, victim, get_only=False):
    """Runs the client against every port of `ip`; returns (its output lines, the targets)."""
    secret = victim.call(op="secret", hex=SECRET.hex())["addr"]
    blank = victim.call(op="secret", hex=bytes(64).hex())["addr"]
    cache = victim.info["addrs"]["reg"][0]
    ops = [f"get:{secret:x}:64", f"get:{cache:x}:64"]
    if not get_only:
        ops += [f"put:{blank:x}:64:41", f"put:{cache:x}:64:42", "get:10:8"]
    env = dict(os.environ, UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
    env.pop("UCX_NET_DEVICES", None)
    r = subprocess.run(["ip", "netns", "exec", ns, raw_client, ip, "1", "65535", *ops], capture_output=True,
                       text=True, timeout=240, env=env)
    assert "done" in r.stdout, r.stdout + r.stderr
    return r.stdout.splitlines(), {"secret": secret, "blank": blank, "cache": cache}


def _assert_nothing_exposed(lines, targets, victim):
    """No op succeeded, no byte changed, and the victim still answers."""
    assert not [ln for ln in lines if " ok" in ln], "\n".join(lines)
    pid = victim.info["pid"]
    assert read_process_memory(pid, targets["blank"], 64) == bytes(64)
    cache = bytes.fromhex(victim.call(op="read", cache="reg", tensor=0)["hex"])
    assert cache[:64] == pattern(1, 0, victim.blocks, victim.block_bytes).tobytes()[:64]
    assert victim.proc.poll() is None, f"the victim died: {victim.proc.returncode}"
    assert victim.call(op="secret", hex="00")["addr"] > 0


def _linker(ns, transport, trusted=False):
    options = {TRUSTED: "1"} if trusted else None
    return Peer(2, transport=transport, auth=TOKEN, prefix=("ip", "netns", "exec", ns), options=options)


def test_auto_before_any_link(two_hosts, raw_client):
    ns_a, ns_b, subnet = two_hosts
    victim = _victim(ns_a, f"{subnet}.1:26561", "auto")
    try:
        lines, targets = _attack(raw_client, ns_b, f"{subnet}.1", victim)
        assert "open 26561" in lines  # the scan reaches the victim: kvblocks' own port
        _assert_nothing_exposed(lines, targets, victim)
    finally:
        victim.close()


def test_auto_linked_by_a_ucx_peer(two_hosts, raw_client):
    """A peer with the extra links from the other host; the attacker is a third party on that network."""
    ns_a, ns_b, subnet = two_hosts
    victim = _victim(ns_a, f"{subnet}.1:26562", "auto")
    peer = _linker(ns_b, "auto")
    try:
        link = peer.call(op="link", cluster=1, ip=f"{subnet}.1", port=26562)
        assert link["rets"] == [0]
        assert peer.call(op="pull", cluster=1, remote_cache=victim.info["reg"], local="alloc", src=[0],
                         dst=[0]) == {"ok": True}
        lines, targets = _attack(raw_client, ns_b, f"{subnet}.1", victim)
        assert "open 26562" in lines
        _assert_nothing_exposed(lines, targets, victim)
        assert link["path"] == "tcp"  # auto turns UCX on only with the opt-in
    finally:
        peer.close()
        victim.close()


def test_transport_ucx_needs_the_trusted_network_opt_in(two_hosts, raw_client):
    """Without the opt-in, Transport=ucx refuses to initialize: no worker, nothing to reach."""
    ns_a, ns_b, subnet = two_hosts
    try:
        victim = _victim(ns_a, f"{subnet}.1:26563", "ucx")
    except Exception as e:  # the peer exits at initialize
        assert TRUSTED in str(e)
        return
    try:  # old behaviour: the worker is open on every interface at initialize
        lines, targets = _attack(raw_client, ns_b, f"{subnet}.1", victim)
        _assert_nothing_exposed(lines, targets, victim)
        pytest.fail("Transport=ucx initialized without the trusted-network opt-in")
    finally:
        victim.close()


def test_trusted_network_worker_is_bound_to_the_link_interface(two_hosts, raw_client):
    """Opt-in, Transport=ucx, listening on 127.0.0.1 and linked (over UCX) by a peer on loopback: the
    worker listens on loopback only, so nothing is open on the host's network address."""
    ns_a, ns_b, subnet = two_hosts
    victim = _victim(ns_a, "127.0.0.1:26564", "ucx", trusted=True)
    peer = _linker(ns_a, "ucx", trusted=True)
    try:
        assert peer.call(op="link", cluster=1, ip="127.0.0.1", port=26564) == {"rets": [0], "path": "ucx"}
        assert peer.call(op="pull", cluster=1, remote_cache=victim.info["reg"], local="alloc", src=[0],
                         dst=[0]) == {"ok": True}
        lines, targets = _attack(raw_client, ns_b, f"{subnet}.1", victim)
        assert not [ln for ln in lines if ln.startswith("open")], "\n".join(lines)
        _assert_nothing_exposed(lines, targets, victim)
    finally:
        peer.close()
        victim.close()


def test_trusted_network_opt_in_is_what_it_says(two_hosts, raw_client):
    """The control: with the opt-in and a linked UCX peer on that network, the same client reads the
    victim's unregistered heap. This is the exposure kvblocks.UcxTrustedNetwork=1 accepts, and shows
    the client above finds what there is to find."""
    ns_a, ns_b, subnet = two_hosts
    victim = _victim(ns_a, f"{subnet}.1:26565", "auto", trusted=True)
    peer = _linker(ns_b, "auto", trusted=True)
    try:
        assert peer.call(op="link", cluster=1, ip=f"{subnet}.1", port=26565) == {"rets": [0], "path": "ucx"}
        lines, targets = _attack(raw_client, ns_b, f"{subnet}.1", victim, get_only=True)
        assert any(ln.endswith(SECRET.hex()) for ln in lines), "\n".join(lines)
    finally:
        peer.close()
        victim.close()
