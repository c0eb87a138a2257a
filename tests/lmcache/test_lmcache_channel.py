# SPDX-License-Identifier: Apache-2.0
"""The kvblocks LMCache transfer channel against LMCache 0.5.6's channel contract, with two real kvblocks
engines: this process (the reading server) and a second LMCache-server-side channel in its own process
(channel_peer.py), whose arena holds ``offset % 251`` at every byte.

Contract (lmcache/v1/distributed/transfer_channel/abstract.py): submit_read(local, remote) -> task id;
query_read_status(id) -> (finished, one success flag per object); addresses are offsets into one
arena per server. Checked here: bytes land; flags are per object; bad offsets are refused per object
without touching memory; a peer without the token gets no link; a frozen (SIGSTOP) or killed peer's read
finishes failed within the channel deadline (below LMCache's load timeout) and no byte lands after.
"""
import json
import os
import selectors
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("lmcache.v1.distributed.transfer_channel", reason="needs LMCache (pip install lmcache==0.5.6)")

from lmcache.v1.distributed.internal_api import L1MemoryDesc  # noqa: E402
from lmcache.v1.distributed.transfer_channel import TransferChannelAddress as Addr  # noqa: E402

from kvblocks.lmcache import CHANNEL_NAME, register  # noqa: E402
from kvblocks.lmcache.channel import KvblocksChannelContext  # noqa: E402
from ports import free_port  # noqa: E402
from procs import wait_dead, wait_stopped  # noqa: E402

pytestmark = pytest.mark.lmcache

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "lmcache-test-token"
ALIGN = 4096
PEER_SIZE = 64 * ALIGN * 16  # 4 MiB
LOCAL_SIZE = 64 * ALIGN * 16
SENTINEL = 0xEE


class PeerProc:
    """channel_peer.py in its own session (so it can be frozen or killed)."""

    def __init__(self, token: str = TOKEN, transport: str = "auto"):
        self.url = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "channel_peer.py"), self.url,
                                      str(PEER_SIZE), str(ALIGN), token, transport],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     process_group=0)
        self.ready = self.line(120)

    def line(self, timeout: float) -> dict:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        assert sel.select(timeout), "peer did not answer"
        out = self.proc.stdout.readline()
        assert out, f"peer exited with {self.proc.wait()}"
        return json.loads(out)

    def ask(self, op: str) -> dict:
        self.proc.stdin.write(json.dumps({"op": op}) + "\n")
        self.proc.stdin.flush()
        return self.line(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def expected(offset: int, size: int) -> np.ndarray:
    return (np.arange(offset, offset + size, dtype=np.int64) % 251).astype(np.uint8)


@pytest.fixture
def peer():
    """A peer of the test's own (the test may freeze or kill it)."""
    p = PeerProc()
    yield p
    p.close()


@pytest.fixture(scope="module")
def shared_peer():
    """A peer the tests that leave it running share (each peer start costs seconds of imports)."""
    p = PeerProc()
    yield p
    p.close()


class Local:
    """This process's channel context over a sentinel-filled arena."""

    def __init__(self, timeout_ms: int = 1000, token: str = TOKEN, transport: str = "auto"):
        self.arena = np.full(LOCAL_SIZE, SENTINEL, dtype=np.uint8)
        url = f"127.0.0.1:{free_port()}"
        self.ctx = KvblocksChannelContext(L1MemoryDesc(ptr=self.arena.ctypes.data, size=LOCAL_SIZE, align_bytes=ALIGN),
                                          url, url, auth_token=token, transport=transport, timeout_ms=timeout_ms)

    def close(self):
        self.ctx.close()


@pytest.fixture
def local():
    loc = Local()
    yield loc
    loc.close()


def run(client, local_addrs, remote_addrs, limit: float = 30.0, polls=None):
    """Submits a read and polls it until it finishes (every 0.5 ms, or back to back, as LMCache's
    benchmark does, with ``polls=[]``, which gets the number of polls)."""
    t0 = time.monotonic()
    tid = client.submit_read(local_addrs, remote_addrs)
    n = 0
    while True:
        r = client.query_read_status(tid)
        n += 1
        if r.is_finished():
            if polls is not None:
                polls.append(n)
            return r.succeeded_mask, time.monotonic() - t0
        assert time.monotonic() - t0 < limit, "read never finished"
        if polls is None:
            time.sleep(0.0005)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_objects_land_byte_for_byte(transport, shared_peer):
    p = shared_peer
    loc = Local(transport=transport)  # the reader picks the path: tcp streams even on one host
    try:
        client = loc.ctx.get_transfer_channel_client(p.url)
        assert loc.ctx.get_transfer_channel_client(p.url) is client  # one client per peer
        sizes = [ALIGN, 3 * ALIGN, 64 * ALIGN, 5 * ALIGN + 100]  # the last is not a whole number of pages
        remote = [Addr(offset=o, size=s) for o, s in zip([7 * ALIGN, 100 * ALIGN, 200 * ALIGN, 300 * ALIGN], sizes)]
        local = loc.ctx.get_transfer_channel_address([(o, s) for o, s in zip([0, 2 * ALIGN, 10 * ALIGN, 80 * ALIGN],
                                                                              sizes)])
        mask, _ = run(client, local, remote)
        assert mask == [True] * 4
        for la, ra in zip(local, remote):
            assert np.array_equal(loc.arena[la.offset:la.offset + la.size], expected(ra.offset, ra.size))
        # nothing outside the destinations (whole pages) changed
        touched = np.zeros(LOCAL_SIZE, bool)
        for la in local:
            touched[la.offset:la.offset + -(-la.size // ALIGN) * ALIGN] = True
        assert (loc.arena[~touched] == SENTINEL).all()
        assert p.ask("clients")["clients"] >= 1
        path = loc.ctx.dd.link_path(client.peer.cluster_id)
        assert path == ("tcp" if transport == "tcp" else "cma"), path
    finally:
        loc.close()


def test_flags_are_per_object_and_bad_offsets_are_refused_without_touching_memory(shared_peer, local):
    client = local.ctx.get_transfer_channel_client(shared_peer.url)
    good = Addr(offset=4 * ALIGN, size=2 * ALIGN)
    cases = [
        (Addr(offset=0, size=2 * ALIGN), good),                                   # good
        (Addr(offset=4 * ALIGN, size=2 * ALIGN), Addr(offset=PEER_SIZE - ALIGN, size=2 * ALIGN)),  # past the peer's arena
        (Addr(offset=8 * ALIGN, size=2 * ALIGN), Addr(offset=ALIGN + 8, size=2 * ALIGN)),          # unaligned remote
        (Addr(offset=12 * ALIGN, size=2 * ALIGN), Addr(offset=ALIGN, size=3 * ALIGN)),             # sizes differ
        (Addr(offset=16 * ALIGN, size=2 * ALIGN), Addr(offset=-ALIGN, size=2 * ALIGN)),            # negative
        (Addr(offset=LOCAL_SIZE - ALIGN, size=2 * ALIGN), good),                  # past our own arena
        (Addr(offset=20 * ALIGN, size=2 * ALIGN), Addr(offset=1 << 60, size=2 * ALIGN)),           # huge
        (Addr(offset=24 * ALIGN, size=2 * ALIGN), good),                          # good again
    ]
    mask, _ = run(client, [c[0] for c in cases], [c[1] for c in cases])
    assert mask == [True, False, False, False, False, False, False, True]
    assert np.array_equal(local.arena[:2 * ALIGN], expected(good.offset, good.size))
    assert np.array_equal(local.arena[24 * ALIGN:26 * ALIGN], expected(good.offset, good.size))
    assert (local.arena[2 * ALIGN:24 * ALIGN] == SENTINEL).all()
    assert (local.arena[26 * ALIGN:] == SENTINEL).all()
    # our own addresses come from our allocator: a bad one is a bug and raises at once
    for bad in [(LOCAL_SIZE, ALIGN), (ALIGN + 1, ALIGN), (0, 0), (-ALIGN, ALIGN)]:
        with pytest.raises(ValueError):
            local.ctx.get_transfer_channel_address([bad])
    with pytest.raises(ValueError):
        client.submit_read([good], [good, good])
    with pytest.raises(KeyError):
        client.query_read_status(12345)


def test_a_peer_without_the_token_gets_no_link(local):
    other = PeerProc(token="another-token")
    try:
        with pytest.raises(ConnectionError):
            local.ctx.get_transfer_channel_client(other.url)
    finally:
        other.close()
    with pytest.raises(ValueError, match="auth_token"):
        KvblocksChannelContext(L1MemoryDesc(ptr=local.arena.ctypes.data, size=LOCAL_SIZE, align_bytes=ALIGN),
                               "127.0.0.1:1", "127.0.0.1:1", auth_token="")


def _big_read(local):
    n, size = 8, 8 * 16 * ALIGN  # 8 x 512 KiB
    return ([Addr(offset=i * size, size=size) for i in range(n)],
            [Addr(offset=((i + 3) % 8) * size, size=size) for i in range(n)])


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_frozen_peer_fails_the_read_by_the_deadline_and_no_byte_lands_after(transport):
    """Over TCP the frozen peer cannot serve: every object fails by the deadline and nothing lands later.
    On one host (auto: cross-memory attach of the registered arena) the reader copies by itself, so the
    read of a frozen peer's locked objects may succeed: then its bytes must be right; either way it
    finishes by the deadline."""
    p = PeerProc(transport=transport)
    loc = Local(timeout_ms=800, transport=transport)
    try:
        client = loc.ctx.get_transfer_channel_client(p.url)
        la, ra = _big_read(loc)
        mask, _ = run(client, la[:1], ra[:1])  # linked and warm
        assert mask == [True]
        loc.arena[:] = SENTINEL
        os.killpg(p.proc.pid, signal.SIGSTOP)
        wait_stopped(p.proc.pid)
        polls = []  # polled back to back: the channel makes the spinning caller wait (<= 1 ms a poll)
        mask, took = run(client, la, ra, polls=polls)
        assert took < 0.8 + 1.0, f"a frozen peer's read took {took:.2f} s against an 0.8 s deadline"
        assert polls[0] <= 2 + 1.8 / 0.001, f"{polls[0]} polls in {took:.2f} s: a spinning caller was not made to wait"
        if transport == "tcp":
            assert mask == [False] * len(la)
        for ok, a, r in zip(mask, la, ra):
            want = expected(r.offset, r.size) if ok else np.full(a.size, SENTINEL, np.uint8)
            assert np.array_equal(loc.arena[a.offset:a.offset + a.size], want)
        snapshot = loc.arena.copy()
        os.killpg(p.proc.pid, signal.SIGCONT)
        time.sleep(1.0)  # whatever the peer had queued it now serves, or drops
        assert np.array_equal(loc.arena, snapshot), "a byte landed after the read was reported finished"
        # the channel recovers: the next read links again and lands
        deadline = time.monotonic() + 10
        while True:
            mask, _ = run(client, la[:2], ra[:2])
            if mask == [True, True] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert mask == [True, True]
        assert np.array_equal(loc.arena[:ra[1].size], expected(ra[0].offset, ra[0].size))
    finally:
        os.killpg(p.proc.pid, signal.SIGCONT)
        loc.close()
        p.close()


def test_a_killed_peer_fails_the_read_fast(peer, local):
    client = local.ctx.get_transfer_channel_client(peer.url)
    la, ra = _big_read(local)
    assert run(client, la[:1], ra[:1])[0] == [True]
    local.arena[:] = SENTINEL
    os.killpg(peer.proc.pid, signal.SIGKILL)
    wait_dead(peer.proc.pid)
    peer.proc.wait()
    mask, took = run(client, la, ra)
    assert mask == [False] * len(la)
    assert took < 1.0 + 1.0
    assert (local.arena == SENTINEL).all()


def test_registered_under_its_name_in_lmcaches_registry():
    from lmcache.v1.distributed.transfer_channel import (delete_transfer_channel_context,
                                                          initialize_transfer_channel_context)

    register(auth_token=TOKEN, timeout_ms=700)
    register(auth_token=TOKEN, timeout_ms=700)  # idempotent
    arena = np.zeros(16 * ALIGN, np.uint8)
    url = f"127.0.0.1:{free_port()}"
    ctx = initialize_transfer_channel_context(CHANNEL_NAME, L1MemoryDesc(arena.ctypes.data, arena.size, ALIGN),
                                              listen_url=url, advertise_url=url, backends=["UCX"])
    try:
        assert isinstance(ctx, KvblocksChannelContext) and ctx.timeout_s == 0.7
    finally:
        delete_transfer_channel_context()


def test_the_launcher_keeps_the_read_deadline_below_lmcaches_load_timeout(monkeypatch):
    from kvblocks.lmcache.__main__ import plan

    monkeypatch.setenv("KVBLOCKS_AUTH_TOKEN", TOKEN)
    module, opts, rest = plan(["server", "--p2p-load-timeout", "5", "--port", "6555"])
    assert module == "lmcache.v1.multiprocess.http_server"
    assert opts["timeout_ms"] == 4000 and opts["metrics_port"] is None and rest[-2:] == ["--p2p-transfer-engine", "kvblocks"]
    with pytest.raises(SystemExit):
        plan(["server", "--p2p-load-timeout", "5", "--kvblocks-timeout-ms", "5000"])
    monkeypatch.delenv("KVBLOCKS_AUTH_TOKEN")
    with pytest.raises(SystemExit):
        plan(["server"])
