# SPDX-License-Identifier: Apache-2.0
"""A proof is good for one connection only (README "Security and threat model", docs/protocol.md
"Handshake"): the AuthToken proofs and a data channel's BIND cover the whole handshake transcript --
both nonces, the connection kind, both cluster ids and the listener's address as the opener dialled
it -- so a party without the token cannot relay an honest engine's proof to another listener."""
import json
import os
import select
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from hostile import (AUTH, BIND, BIND_LABEL, CHALLENGE, CONFIRM, CONFIRM_ACK, HELLO, HELLO_ACK, LINK_INFO,
                     LISTENER_LABEL, OPENER_LABEL, READ_REQ, READ_RESP, VERSION, endpoint, link_info, mac,
                     recv_frame, request, send_frame, transcript)
from peer import pattern
from procs import Peer

S = kb.Status
HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "s3cret"
TENSORS, BLOCKS, BB = 2, 4, 64


@pytest.fixture
def victim():
    """Cluster 1, in its own process, listening with the token."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB, auth=TOKEN)
    yield peer, port
    peer.close()


class Relay:
    """tests/proof_relay.py in its own process: it does not hold the token."""

    def __init__(self, mode, victim_port, cache=0):
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "proof_relay.py"), "--mode", mode, "--victim",
                                      str(victim_port), "--cache", str(cache)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.port = self.line(30)["port"]

    def line(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        out = self.proc.stdout.readline() if ready else b""
        assert out, f"relay said nothing within {timeout} s (exit {self.proc.poll()})"
        return json.loads(out)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        err = self.proc.stderr.read().decode(errors="replace")
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()
        return err


def _opener(cid=2):
    """An honest engine holding the token."""
    me = kb.LlmDataDist(cid, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_AUTH_TOKEN: TOKEN})
    return me


def test_a_relayed_proof_is_refused_and_nothing_is_read_or_written(victim):
    """Contract: relaying an honest opener's proof to another listener fails. The relay (no token)
    accepts the honest engine's connections, opens its own to the victim and passes HELLO, CHALLENGE
    and AUTH through, then speaks for itself. The victim must refuse the relayed AUTH: the proof names
    the relay's address, not the victim's. Nothing is read, nothing written."""
    peer, port = victim
    before = peer.digest()
    relay = Relay("handshake", port, cache=peer.info["reg"])
    me = _opener()
    try:
        rets = me.link_llm_clusters([cluster(1, relay.port)], 5000)
        rep = relay.line(30)
        print(f"\nrelayed proof: {rep}")
        assert rep["ctrl_ack"] == S.LLM_LINK_FAILED, f"the victim authenticated a relayed proof: {rep}"
        assert rep == {"ctrl_ack": S.LLM_LINK_FAILED, "linked": False, "read": None, "wrote": False}
        assert rets == [S.LLM_LINK_FAILED]  # the victim's proof names its own address, not the relay's
        assert peer.digest() == before
        assert peer.wait_stderr("rejected a link from cluster 2: wrong kvblocks.AuthToken proof"), peer._stderr()
    finally:
        me.finalize()
        relay.close()
    peer.close()


def test_a_byte_relay_between_token_holders_yields_no_link(victim):
    """Contract: the proof names the address the opener dialled. A plain TCP proxy on another port
    between two token holders changes nothing in the bytes, but the listener checks its own address:
    no link through it. Dialled directly, the same engines link and transfer."""
    peer, port = victim
    relay = Relay("bytes", port)
    me = _opener()
    try:
        assert me.link_llm_clusters([cluster(1, relay.port)], 5000) == [S.LLM_LINK_FAILED]
        assert me.link_path(1) == ""
        assert me.link_llm_clusters([cluster(1, port)], 5000) == [S.LLM_SUCCESS]
        dst = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), dst, [3], [0])
        assert np.array_equal(dst.numpy(1)[0], pattern(1, 1, BLOCKS, BB)[3])
        assert peer.wait_stderr("rejected a link from cluster 2: wrong"), peer._stderr()
    finally:
        me.finalize()
        relay.close()
    peer.close()


# ------------------------------------------------------------------ the transcript, by hand
def token_handshake(port, kind, opener, listener=1, tamper=None, ip="127.0.0.1"):
    """HELLO .. HELLO_ACK as a token holder computing the proofs of docs/protocol.md by hand.
    `tamper(fields)` changes what our AUTH proof covers (a dict of transcript fields, or returns
    the AUTH proof itself). Returns (socket, HELLO_ACK status, the true transcript)."""
    s = socket.create_connection((ip, port), timeout=5)
    cn = os.urandom(16)
    send_frame(s, HELLO, struct.pack("<IIQ", VERSION, kind, opener) + cn)
    t, _, ch = recv_frame(s)
    assert t == CHALLENGE
    sn, auth_required, has_proof, proof = ch[:16], ch[16], ch[17], ch[18:50]
    fields = dict(kind=kind, opener=opener, listener=listener, client_nonce=cn, server_nonce=sn,
                  where=endpoint(*s.getpeername()[:2]))
    true = transcript(**fields)
    key = TOKEN.encode()
    assert auth_required and has_proof and proof == mac(key, LISTENER_LABEL, true), "CHALLENGE proof is not as documented"
    sent = mac(key, OPENER_LABEL, true)
    if tamper is not None:
        changed = dict(fields)
        out = tamper(changed, proof)
        sent = out if isinstance(out, bytes) else mac(key, OPENER_LABEL, transcript(**changed))
    send_frame(s, AUTH, b"\x01" + sent)
    t, status, _ = recv_frame(s)
    assert t == HELLO_ACK
    return s, status, true


def _set(**kw):
    return lambda f, proof: f.update(kw)


TAMPER = {
    "kind": _set(kind=2),
    "opener cluster": _set(opener=78),
    "listener cluster": _set(listener=9),
    "listener ip": _set(where=endpoint("127.0.0.2", 0)),
    "listener port": lambda f, proof: f.update(where=f["where"][:17] + struct.pack("<H", 1)),
    "no address": _set(where=endpoint()),
    "client nonce": _set(client_nonce=bytes(16)),
    "server nonce": _set(server_nonce=bytes(16)),
    "reflected listener proof": lambda f, proof: proof,
    "version 4 proof": lambda f, proof: mac(TOKEN.encode(), OPENER_LABEL, transcript(version=4, **f)),
}


@pytest.mark.parametrize("what", list(TAMPER))
def test_the_listener_checks_every_transcript_field(victim, what):
    """Contract: the opener's proof covers both nonces, the connection kind, both cluster ids and the
    listener's address (docs/protocol.md). Computed as documented it is accepted, and the CHALLENGE's
    proof is the documented one; with any one field changed, or the listener's own proof reflected,
    the listener refuses (HELLO_ACK LLM_LINK_FAILED)."""
    peer, port = victim
    s, status, _ = token_handshake(port, 1, 77)
    s.close()
    assert status == 0
    s, status, _ = token_handshake(port, 1, 77, tamper=TAMPER[what])
    s.close()
    assert status == S.LLM_LINK_FAILED


def _token_link(port, opener=77):
    """A control link as a token holder; returns (ctrl socket, link token)."""
    ctrl, status, _ = token_handshake(port, 1, opener)
    assert status == 0
    send_frame(ctrl, LINK_INFO, link_info(opener))
    t, status, payload = recv_frame(ctrl)
    assert (t, status) == (LINK_INFO, 0)
    send_frame(ctrl, CONFIRM, struct.pack("<qB", 0, 0))
    assert recv_frame(ctrl)[:2] == (CONFIRM_ACK, 0)
    return ctrl, payload[8:24]


def _bind(s, payload):
    send_frame(s, BIND, payload)
    try:
        t, status, _ = recv_frame(s)
    except ConnectionError:
        return None  # dropped without an answer (a malformed BIND)
    assert t == BIND
    return status


def test_a_bind_is_good_for_one_data_channel_of_one_link(victim):
    """Contract: a data channel's BIND is the MAC of its own transcript under the link token. It
    binds that channel; replayed on another connection, made for another listener cluster or kind,
    keyed by another link's token, or the bare link token (version 4), it is refused and the channel
    serves nothing."""
    peer, port = victim
    ctrl, token = _token_link(port, 77)
    ctrl2, token2 = _token_link(port, 78)
    socks = [ctrl, ctrl2]
    try:
        s, status, tr = token_handshake(port, 2, 77)
        socks.append(s)
        assert status == 0
        good = mac(token, BIND_LABEL, tr)
        assert _bind(s, good) == 0
        send_frame(s, READ_REQ, request(peer.info["reg"], [1], [(2 * BB, BB)]))
        assert recv_frame(s) == (READ_RESP, 0, pattern(1, 1, BLOCKS, BB)[2].tobytes())

        def fresh():
            c, st, t = token_handshake(port, 2, 77)
            socks.append(c)
            assert st == 0
            return c, t

        c, _ = fresh()
        assert _bind(c, good) == S.LLM_NOT_YET_LINK  # replayed on another connection
        c, t = fresh()
        other = transcript(kind=2, opener=77, listener=9, client_nonce=t[24:40], server_nonce=t[40:56], where=t[56:])
        assert _bind(c, mac(token, BIND_LABEL, other)) == S.LLM_NOT_YET_LINK  # made for another listener
        c, t = fresh()
        assert _bind(c, mac(token2, BIND_LABEL, t)) == S.LLM_NOT_YET_LINK  # another link's token
        c, t = fresh()
        assert _bind(c, mac(token, OPENER_LABEL, t)) == S.LLM_NOT_YET_LINK  # another label
        c, _ = fresh()
        assert _bind(c, token) is None  # the bare token: malformed, dropped
        c.settimeout(5)
        assert c.recv(1) == b""
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("listen", ["0.0.0.0", "[::]"])
def test_token_links_whatever_address_form_the_listener_sees(listen):
    """Contract: both sides name the listener the same way: a wildcard listener sees the address it
    was dialled at, and a dual-stack listener's IPv4-mapped address counts as IPv4."""
    port = free_port()
    try:
        peer = Peer(1, listen=f"{listen}:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB, auth=TOKEN)
    except Exception as e:  # noqa: BLE001 - no IPv6 here
        pytest.skip(f"cannot listen on {listen}: {e}")
    me = _opener()
    try:
        assert me.link_llm_clusters([cluster(1, port)], 5000) == [S.LLM_SUCCESS]
        dst = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), dst, [1], [0])
        assert np.array_equal(dst.numpy(0)[0], pattern(1, 0, BLOCKS, BB)[1])
    finally:
        me.finalize()
        peer.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"])
def test_hixl_engines_with_a_token_link_over_ipv4_and_ipv6(host, monkeypatch):
    """Contract: hixl connects by engine name; with a token the proofs name the cluster id derived
    from that name and the address dialled, IPv6 included, and the link works over TCP."""
    import ctypes
    import kvblocks.hixl as hx
    monkeypatch.setenv("KVBLOCKS_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("KVBLOCKS_TRANSPORT", "tcp")
    s, c = hx.Hixl(), hx.Hixl()
    sname, cname = f"{host}:{free_port()}", f"{host}:{free_port()}"
    if s.initialize(sname) != hx.SUCCESS:
        pytest.skip(f"cannot listen on {sname}")
    try:
        assert c.initialize(cname) == hx.SUCCESS
        src, dst = (ctypes.c_uint8 * 4096).from_buffer_copy(bytes(range(256)) * 16), (ctypes.c_uint8 * 4096)()
        assert s.register_mem(hx.MemDesc(ctypes.addressof(src), 4096), hx.MEM_HOST)[0] == hx.SUCCESS
        assert c.register_mem(hx.MemDesc(ctypes.addressof(dst), 4096), hx.MEM_HOST)[0] == hx.SUCCESS
        assert c.connect(sname, 5000) == hx.SUCCESS
        op = hx.TransferOpDesc(ctypes.addressof(dst), ctypes.addressof(src), 4096)
        assert c.transfer_sync(sname, hx.READ, [op], 5000) == hx.SUCCESS
        assert bytes(dst) == bytes(src)
    finally:
        c.finalize()
        s.finalize()
