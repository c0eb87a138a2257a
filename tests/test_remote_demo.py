# SPDX-License-Identifier: Apache-2.0
"""Two hosts in two commands: `kvblocks demo --listen` in one network namespace, `kvblocks demo
--connect` and `kvblocks ping` in another, as a newcomer would run them (the CLI, real processes)."""
import os
import re
import socket
import subprocess
import sys

import pytest

import kvblocks as kb
from netns import two_hosts  # noqa: F401  (a fixture)

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(kb.__file__)))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVBLOCKS_AUTH_TOKEN")}
    env.update(PYTHONPATH=PKG_PARENT, KVBLOCKS_UCX_PLUGIN="off", **extra)
    return env


def _kvblocks(ns, *args, env, cwd, **kw):
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "kvblocks", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _listen(ns, addr, count, env, cwd):
    """Start a listener and wait for its "listening" line (the engine is up and bound)."""
    p = _kvblocks(ns, "demo", "--listen", addr, "--count", str(count), env=env, cwd=cwd)
    first = p.stdout.readline()
    assert first.startswith(f"listening on {addr}"), first + p.stdout.read()
    return p


@pytest.mark.parametrize("token", [None, "two-hosts-demo"])
def test_demo_and_ping_between_two_hosts(two_hosts, token, tmp_path):  # noqa: F811
    ns_a, ns_b, subnet = two_hosts
    addr = f"{subnet}.1:26601"
    env = _env(**({"KVBLOCKS_AUTH_TOKEN": token} if token else {}))
    listener = _listen(ns_a, addr, 2, env, tmp_path)
    try:
        demo = _kvblocks(ns_b, "demo", "--connect", addr, env=env, cwd=tmp_path)
        out, _ = demo.communicate(timeout=60)
        assert demo.returncode == 0, out
        assert re.search(r"data path: tcp", out), out
        assert re.search(r"pull  \[1, 3, 5, 7\] -> \[0, 2, 4, 6\] x 8 tensors: 2097152 bytes .* verified: OK", out), out
        assert re.search(r"push  layer 3 .* 524288 bytes .* verified: OK", out), out

        ping = _kvblocks(ns_b, "ping", addr, "--count", "3", env=env, cwd=tmp_path)
        out, _ = ping.communicate(timeout=60)
        assert ping.returncode == 0, out
        assert re.search(r"data path: tcp", out), out
        rtt = float(re.search(r"latency \(4 KiB pull\): median ([0-9.]+) us", out).group(1))
        bw = float(re.search(r"bandwidth \(32 MiB pull\): median ([0-9.]+) GB/s", out).group(1))
        assert rtt > 0 and bw > 0, out
        assert "verified: OK" in out, out

        served, _ = listener.communicate(timeout=30)
        assert listener.returncode == 0, served
        assert len(re.findall(r"peer \d+ done \((demo|ping)\): its bytes verified OK", served)) == 2, served
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()


def test_a_peer_without_the_token_cannot_use_the_listener(two_hosts, tmp_path):  # noqa: F811
    """The listener's token binds: a connecting side without it gets a link error, not the demo."""
    ns_a, ns_b, subnet = two_hosts
    addr = f"{subnet}.1:26602"
    listener = _listen(ns_a, addr, 1, _env(KVBLOCKS_AUTH_TOKEN="right"), tmp_path)
    try:
        for env in (_env(), _env(KVBLOCKS_AUTH_TOKEN="wrong")):
            ping = _kvblocks(ns_b, "ping", addr, "--count", "1", env=env, cwd=tmp_path)
            out, _ = ping.communicate(timeout=60)
            assert ping.returncode == 1, out
            assert re.search(rf"kvblocks ping: LinkError: linking to the listener at {addr} \(cluster 1\) failed: "
                             r"LLM_LINK_FAILED \(0x5010b009\): auth_refused: ", out), out
            assert "Traceback" not in out, out
        assert listener.poll() is None  # still serving
    finally:
        listener.kill()
        listener.wait()


def test_a_listener_on_port_0_prints_the_port_it_got(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "kvblocks", "demo", "--listen", "127.0.0.1:0", "--count", "1"],
                         env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = p.stdout.readline()
        port = int(re.match(r"listening on 127\.0\.0\.1:(\d+) as cluster 1", first).group(1))
        assert port > 0, first
        ping = subprocess.run([sys.executable, "-m", "kvblocks", "ping", f"127.0.0.1:{port}", "--count", "1"],
                              env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert ping.returncode == 0 and "verified: OK" in ping.stdout, ping.stdout + ping.stderr
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_closed_port_says_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "kvblocks", "ping", f"127.0.0.1:{port}"], env=_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "LLM_LINK_FAILED" in r.stderr and "refused: connect" in r.stderr, r.stderr


@pytest.mark.parametrize("args,why", [(["demo", "--connect", "10.0.0.1"], "is not IPV4:PORT"),
                                      (["demo", "--connect", "0.0.0.0:26000"], "not the wildcard"),
                                      (["demo", "--listen", "host:26000"], "is not an IPv4 address"),
                                      (["demo", "--count", "2"], "--count goes with --listen"),
                                      (["ping", "1.2.3.4:0"], "is not IPV4:PORT"),
                                      (["demo", "--listen", "1.2.3.4:65536"], "is not IPV4:PORT"),
                                      (["ping", "1.2.3.4:1", "--count", "0"], "at least 1")])
def test_bad_addresses_get_a_usage_error(args, why, tmp_path):
    r = subprocess.run([sys.executable, "-m", "kvblocks", *args], env=_env(), cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and why in r.stderr, r.stderr
