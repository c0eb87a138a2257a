# SPDX-License-Identifier: Apache-2.0
"""Links, identity and the handshake (README "Security and threat model"): nothing a peer says widens
what it can touch, links survive both sides acting at once, the cluster id is checked, and everything
before authentication is bounded."""
import os
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import mix_engine, cluster, free_port
from hostile import (AUTH, BIND, CHALLENGE, CONFIRM, CONFIRM_ACK, HDR, HELLO, HELLO_ACK, LINK_INFO, MAGIC, READ_REQ,
                     READ_RESP, UCX_INFO, handshake, link_info, open_link, parse_link_info, recv_exact,
                     recv_frame, send_frame)
from procs import Peer

S = kb.Status


_engine = mix_engine


def _proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _table_entry(cid, addrs, tensor_bytes=4096, memfd=None):
    """One cache-table entry with an address descriptor and, optionally, a memfd descriptor."""
    n = len(addrs)
    descs = []
    if memfd is not None:
        body = struct.pack("<iQQQQ", memfd, 0, 0, tensor_bytes * n, tensor_bytes)
        descs.append(struct.pack("<BI", 1, len(body)) + body)
    body = b"".join(struct.pack("<Q", a) for a in addrs)
    descs.append(struct.pack("<BI", 2, len(body)) + body)
    return (struct.pack("<qBqIQQQQH", cid, 1, -1, n, tensor_bytes, 8, 1, tensor_bytes // 8, len(descs)) +
            b"".join(descs))


class HostileListener:
    """A hand-written listener that lies: it answers every LINK_INFO with `make_info(ours)` (typically
    our own identity echoed back and caches announced at pointers of its choosing), serves data
    channels with error replies, and records every byte it receives."""

    def __init__(self, make_info, cluster_id=77, challenge=None, ucx_info=None):
        # ucx_info: after CONFIRM, read the opener's UCX_INFO and answer with this payload
        self.make_info, self.cluster_id, self.challenge, self.ucx_info = make_info, cluster_id, challenge, ucx_info
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        self.received = []  # (type, payload) of every frame
        self.ours = None
        self.conns = []
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _recv(self, s):
        t, status, payload = recv_frame(s)
        self.received.append((t, payload))
        return t, status, payload

    def _accept(self):
        while not self.stop:
            try:
                s, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        try:
            t, _, hello = self._recv(s)
            kind, = struct.unpack_from("<I", hello, 4)
            send_frame(s, CHALLENGE, self.challenge or (os.urandom(16) + b"\0\0" + b"\0" * 32))
            self._recv(s)  # AUTH
            send_frame(s, HELLO_ACK)
            if kind == 1:
                _, _, payload = self._recv(s)
                self.ours = parse_link_info(payload)
                send_frame(s, LINK_INFO, self.make_info(self.ours, payload))
                self._recv(s)  # CONFIRM
                if self.ucx_info is not None:
                    self._recv(s)  # the opener's UCX_INFO
                    send_frame(s, UCX_INFO, self.ucx_info)
                send_frame(s, CONFIRM_ACK)
            else:
                self._recv(s)  # BIND
                send_frame(s, BIND)
            while True:
                t, _, _ = self._recv(s)
                if t == READ_REQ:
                    send_frame(s, READ_RESP, status=S.LLM_KV_CACHE_NOT_EXIST)
        except (ConnectionError, OSError, AssertionError, struct.error):
            pass

    def close(self):
        self.stop = True
        self.srv.close()
        for s in self.conns:
            s.close()


def _echo(addrs, memfd=None, local_name=b""):
    def make(ours, payload):
        return link_info(77, caps=15, ident=ours["identity"], local_name=local_name, local_key=ours["local_key"],
                         table=struct.pack("<I", 1) + _table_entry(5, addrs, memfd=memfd))
    return make


@pytest.fixture
def opener():
    me = _engine(1)
    yield me
    me.finalize()


@pytest.mark.parametrize("what", ["null-ish pointer", "our secret", "memfd claim", "our payload echoed"])
def test_hostile_listener_echoing_our_identity_gets_tcp_only(opener, what):
    """Contract: nothing a peer says widens what it can touch. A listener that copies our identity
    (boot id, netns, instance, probe) and announces caches at 0x10, at a secret in our heap or as a
    memfd gets a TCP path: our process never copies from those addresses and never crashes."""
    secret = np.frombuffer(b"TOP-SECRET-BYTES" * 256, dtype=np.uint8).copy()
    if what == "null-ish pointer":
        make = _echo([0x10])
    elif what == "our secret":
        make = _echo([secret.ctypes.data])
    elif what == "memfd claim":
        make = _echo([secret.ctypes.data], memfd=3)
    else:
        def make(ours, payload):  # our own LINK_INFO back, our proof included, only the cluster id changed
            return struct.pack("<Q", 77) + payload[8:]
    h = HostileListener(make)
    try:
        assert opener.link_llm_clusters([cluster(77, h.port)]) == [S.LLM_SUCCESS]
        assert opener.link_path(77) == "tcp"
        dst = opener.allocate_cache(kb.CacheDesc(1, kb.DataType.DT_UINT8, [8, 512]))
        remote = 5 if what != "our payload echoed" else 1
        with pytest.raises(kb.LLMException):
            opener.pull_kv_blocks(kb.CacheIndex(77, remote), dst, [0], [0])
        assert not dst.numpy(0).any()
        assert all(b"TOP-SECRET" not in p for _, p in h.received)
    finally:
        h.close()


def test_hostile_listener_with_a_local_socket_in_our_own_process_gets_tcp(opener):
    """Contract: same-host paths come from the kernel (SO_PEERCRED), not claims. The listener echoes
    our identity and points us at a Unix socket that answers the exchange correctly and passes a
    memfd -- but the socket belongs to our own process, so the kernel-verified pid gives it away."""
    name = f"kvblocks-test-{os.getpid()}-{time.monotonic_ns()}".encode()
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uds.bind(b"\0" + name)
    uds.listen(1)
    served = []

    def serve():
        uds.settimeout(5)
        try:
            c, _ = uds.accept()
            data = c.recv(4096)
            served.append(data)
            fd = os.memfd_create("fake")
            os.ftruncate(fd, 4096)
            socket.send_fds(c, [struct.pack("<I", 28) + h.ours["local_key"] + struct.pack("<Iq", 1, 5)], [fd])
            time.sleep(0.5)
            c.close()
        except OSError:
            pass

    h = HostileListener(_echo([0x10], memfd=3, local_name=name))
    threading.Thread(target=serve, daemon=True).start()
    try:
        assert opener.link_llm_clusters([cluster(77, h.port)]) == [S.LLM_SUCCESS]
        assert opener.link_path(77) == "tcp"
    finally:
        h.close()
        uds.close()


def test_hostile_opener_echoing_the_listener_identity_gets_tcp():
    """Contract: nothing a peer says widens what it can touch, in reverse: an opener that replays the
    listener's own identity (learnt from an earlier link) is still a TCP peer to the listener."""
    port = free_port()
    me = _engine(1, port)
    try:
        ctrl, status, payload = handshake(port, 1, 78)
        assert status == 0
        theirs = parse_link_info(payload)
        ctrl.close()
        info = link_info(79, caps=15, ident=theirs["identity"], table=struct.pack("<I", 1) + _table_entry(5, [0x10]))
        ctrl, status, _ = handshake(port, 1, 79, info=info)
        assert status == 0
        send_frame(ctrl, CONFIRM, struct.pack("<qB", 0, 1))  # asks for the local exchange, never connects
        t, status, _ = recv_frame(ctrl)
        assert (t, status) == (CONFIRM_ACK, 0)
        assert me.link_path(79) == "tcp"
        ctrl.close()
    finally:
        me.finalize()


def test_with_a_token_nothing_but_hello_and_proof_reaches_an_unproven_listener():
    """Contract: bounded before authentication. With kvblocks.AuthToken set, a listener that cannot
    prove the token sees only our fixed-size HELLO and our proof: no pid, identity, table or token."""
    me = _engine(1, **{kb.OPTION_AUTH_TOKEN: "s3cret"})
    h = HostileListener(_echo([0x10]), challenge=os.urandom(16) + b"\1\1" + os.urandom(32))
    try:
        assert me.link_llm_clusters([cluster(77, h.port)]) == [S.LLM_LINK_FAILED]
        time.sleep(0.1)
        assert [t for t, _ in h.received] == [HELLO, AUTH]
        assert [len(p) for _, p in h.received] == [32, 33]
    finally:
        h.close()
        me.finalize()


def test_the_cluster_id_is_checked():
    """Contract: the cluster id is checked. Linking "cluster 999" at a listener of cluster 1 fails with
    LLM_LINK_FAILED and a reason naming both ids; nothing is registered under either id."""
    port = free_port()
    me = _engine(1, port)
    peer = Peer(2)
    try:
        out = peer.call(op="link", cluster=999, ip="127.0.0.1", port=port)
        assert out["rets"] == [S.LLM_LINK_FAILED]
        assert peer.wait_stderr("is cluster 1, not cluster 999"), peer._stderr()
        assert me.link_path(2) == ""
        assert peer.call(op="link", cluster=1, ip="127.0.0.1", port=port)["rets"] == [0]
    finally:
        peer.close()
        me.finalize()


def test_oversized_hello_is_refused_without_allocating():
    """Contract: bounded before authentication. HELLOs announcing 16 MiB (64 at once, 2 KiB sent each)
    are refused from the header: the listener's RSS stays flat."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}")
    try:
        pid = peer.info["pid"]
        before = _proc_status(pid, "VmRSS")
        socks = []
        for _ in range(64):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(HDR.pack(MAGIC, HELLO, 0, 0, 0, 16 << 20) + b"\0" * 2048)
            socks.append(s)
        time.sleep(0.5)
        grown = _proc_status(pid, "VmRSS") - before
        for s in socks:
            s.close()
        assert grown < 8 * 1024, f"RSS grew by {grown} KiB"
    finally:
        peer.close()


def test_slow_handshakes_delay_a_real_link_by_at_most_two_seconds():
    """Contract: bounded before authentication. 200 sockets that send one byte and stall hold no slot
    for more than 2 s and never make the listener refuse a real link."""
    port = free_port()
    me = _engine(1, port)
    other = _engine(2)
    socks = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"K")
            socks.append(s)
        t0 = time.monotonic()
        assert other.link_llm_clusters([cluster(1, port)], 5000) == [S.LLM_SUCCESS]
        assert time.monotonic() - t0 < 2.0 + 1.0
    finally:
        for s in socks:
            s.close()
        other.finalize()
        me.finalize()


def test_a_link_cannot_open_unbounded_data_channels():
    """Contract: bounded before authentication (and after): a valid link opening 300 data channels gets
    at most kMaxRequesterChannels (8) each way; the rest are refused, so threads stay bounded."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}")
    socks = []
    try:
        pid = peer.info["pid"]
        ctrl, token = open_link(port)
        base = _proc_status(pid, "Threads")
        accepted = 0
        for i in range(300):
            s, status, _ = handshake(port, 2 if i % 2 == 0 else 3, 77, token=token)
            socks.append(s)
            accepted += status == 0
        time.sleep(0.2)
        threads = _proc_status(pid, "Threads")
        assert accepted <= 16
        assert threads <= base + 8 + 4, (base, threads)
        ctrl.close()
    finally:
        for s in socks:
            s.close()
        peer.close()


@pytest.fixture
def two_listeners():
    pa, pb = free_port(), free_port()
    a, b = _engine(1, pa), _engine(2, pb)
    yield a, b, pa, pb
    a.finalize()
    b.finalize()


def _together(fa, fb):
    go = threading.Barrier(2)
    out = {}

    def run(key, fn):
        go.wait()
        out[key] = fn()

    ts = [threading.Thread(target=run, args=("a", fa)), threading.Thread(target=run, args=("b", fb))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    return out["a"], out["b"]


def test_racing_links_and_unlinks_both_succeed_100_times(two_listeners):
    """Contract: links survive both sides acting at once. 100 trials: both engines link to each other
    at the same moment (both LLM_SUCCESS, one shared in-process link), then both unlink at the same
    moment (both LLM_SUCCESS, no link left)."""
    a, b, pa, pb = two_listeners
    fails = []
    for trial in range(100):
        ra, rb = _together(lambda: a.link_llm_clusters([cluster(2, pb)], 3000),
                           lambda: b.link_llm_clusters([cluster(1, pa)], 3000))
        if ra != [S.LLM_SUCCESS] or rb != [S.LLM_SUCCESS] or a.link_path(2) != "inprocess" or \
                b.link_path(1) != "inprocess":
            fails.append(("link", trial, ra, rb, a.link_path(2), b.link_path(1)))
        # A second call on either side is a real "already linked".
        if a.link_llm_clusters([cluster(2, pb)]) != [S.LLM_ALREADY_LINK]:
            fails.append(("relink", trial))
        ua, ub = _together(lambda: a.unlink_llm_clusters([cluster(2, pb)], 3000),
                           lambda: b.unlink_llm_clusters([cluster(1, pa)], 3000))
        if ua != [S.LLM_SUCCESS] or ub != [S.LLM_SUCCESS] or a.link_path(2) or b.link_path(1):
            fails.append(("unlink", trial, ua, ub))
    assert not fails, fails[:5]


def test_racing_links_across_processes(two_listeners):
    """Contract: links survive both sides acting at once, across two processes (20 trials; the
    second process links and unlinks while we do)."""
    a, _, pa, _ = two_listeners
    pp = free_port()
    peer = Peer(3, listen=f"127.0.0.1:{pp}")
    fails = []
    try:
        for trial in range(20):
            peer.send(op="link", cluster=1, ip="127.0.0.1", port=pa)
            ra = a.link_llm_clusters([cluster(3, pp)], 5000)
            rp = peer.reply()
            if ra != [S.LLM_SUCCESS] or rp["rets"] != [0]:
                fails.append(("link", trial, ra, rp))
            peer.send(op="unlink", cluster=1, ip="127.0.0.1", port=pa)
            ua = a.unlink_llm_clusters([cluster(3, pp)], 5000)
            up = peer.reply()
            if ua != [S.LLM_SUCCESS] or up["rets"] != [0]:
                fails.append(("unlink", trial, ua, up))
    finally:
        peer.close()
    assert not fails, fails[:5]


def test_no_call_succeeds_through_a_dead_peers_mapping():
    """Contract: a call never succeeds through a dead peer's mapping. Right after a same-host peer is
    killed (SIGKILL, reaped), the next pull of its shared-memory cache is LLM_NOT_YET_LINK."""
    me = _engine(2)
    try:
        for _ in range(3):
            port = free_port()
            peer = Peer(1, listen=f"127.0.0.1:{port}")
            assert me.link_llm_clusters([cluster(1, port)]) == [S.LLM_SUCCESS]
            assert me.link_path(1) in ("shm", "shm+cma", "cma")
            dst = me.allocate_cache(kb.CacheDesc(4, kb.DataType.DT_UINT8, [8, 64]))
            me.pull_kv_blocks(kb.CacheIndex(1, peer.info["alloc"]), dst, [1], [1])
            os.kill(peer.info["pid"], signal.SIGKILL)
            peer.proc.wait()
            with pytest.raises(kb.LLMException) as e:
                me.pull_kv_blocks(kb.CacheIndex(1, peer.info["alloc"]), dst, [2], [2])
            assert e.value.status_code == S.LLM_NOT_YET_LINK
            peer.close()
            me.unlink_llm_clusters([cluster(1, port)], force=True)
            me.deallocate_cache(dst)
    finally:
        me.finalize()


def test_refused_reverse_channels_are_not_counted_forever():
    """Contract: pending_reverse is released when a reverse channel is refused. An opener that refuses
    every OPEN_REVERSE (REVERSE_REFUSED) leaves the listener's pushes sharing the one reverse channel:
    they all succeed, and the listener keeps asking (a leaked count would stop it after 7 requests)."""
    from hostile import OPEN_REVERSE, REVERSE_REFUSED, WRITE_DONE, WRITE_REQ
    port = free_port()
    me = _engine(1, port)
    try:
        src = me.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 512]))
        info = link_info(77, table=struct.pack("<I", 1) + _table_entry(5, [0x10, 0x20]))
        ctrl, status, payload = handshake(port, 1, 77, info=info)
        assert status == 0
        token = payload[8:24]
        send_frame(ctrl, CONFIRM, struct.pack("<qB", 0, 0))
        assert recv_frame(ctrl)[:2] == (CONFIRM_ACK, 0)
        rev, status, _ = handshake(port, 3, 77, token=token)
        assert status == 0
        asked = []

        def refuse():
            try:
                while True:
                    t, _, _ = recv_frame(ctrl)
                    if t == OPEN_REVERSE:
                        asked.append(t)
                        send_frame(ctrl, REVERSE_REFUSED)
            except (ConnectionError, OSError):
                pass

        def serve():
            try:
                while True:
                    t, _, body = recv_frame(rev)
                    assert t == WRITE_REQ
                    recv_exact(rev, struct.unpack_from("<Q", body, 32)[0])
                    time.sleep(0.05)  # slow, so concurrent pushes need another channel
                    send_frame(rev, WRITE_DONE)
            except (ConnectionError, OSError, AssertionError):
                pass

        threading.Thread(target=refuse, daemon=True).start()
        threading.Thread(target=serve, daemon=True).start()
        errors = []

        def push():
            try:
                me.push_kv_blocks(src, kb.CacheIndex(77, 5), [0], [0])
            except kb.LLMException as e:
                errors.append(e)

        for _ in range(4):
            ts = [threading.Thread(target=push) for _ in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(10)
        assert not errors, errors
        assert len(asked) > 7
        ctrl.close()
        rev.close()
    finally:
        me.finalize()
