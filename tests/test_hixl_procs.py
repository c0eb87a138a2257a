# SPDX-License-Identifier: Apache-2.0
"""kvblocks.hixl across two real processes (tests/hixl_peer.py is the server engine S; this process
is the client C), on the same-host path (auto: cross-memory attach) and over TCP: H39, H44, hostile
ranges, notify ordering after transfers, and a frozen (SIGSTOPped) peer."""
import ctypes
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

import kvblocks
import kvblocks.hixl as hx
from ports import free_port
from procs import read_process_memory, wait_stopped

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))
MiB = 1 << 20


class HixlPeer:
    """tests/hixl_peer.py: a server engine with one registered buffer, driven line by line."""

    def __init__(self, size, fill, transport):
        self.name = f"127.0.0.1:{free_port()}"
        env = dict(os.environ, KVBLOCKS_TRANSPORT=transport)
        env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "hixl_peer.py"), self.name, str(size),
                                      str(fill)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._buf = b""
        info = self.reply(30)
        self.addr, self.pid = info["addr"], info["pid"]

    def reply(self, timeout=60):
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            assert self.proc.poll() is None, f"hixl peer exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "hixl peer did not answer"
            if select.select([fd], [], [], 0.02)[0]:
                self._buf += os.read(fd, 65536)
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def send(self, **cmd):
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, **cmd):
        self.send(**cmd)
        return self.reply()

    def digest(self, addr, n):
        return self.call(op="digest", addr=addr, len=n)["sha"]

    def close(self):
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            try:
                self.send(op="exit")
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def sha(b):
    return hashlib.sha256(bytes(b)).hexdigest()


@pytest.fixture(params=["auto", "tcp"])
def transport(request, monkeypatch):
    monkeypatch.setenv("KVBLOCKS_TRANSPORT", request.param)
    return request.param


def client(size, fill=0):
    c = hx.Hixl()
    assert c.initialize(f"127.0.0.1:{free_port()}") == hx.SUCCESS
    b = (ctypes.c_uint8 * size)()
    ctypes.memset(b, fill, size)
    assert c.register_mem(hx.MemDesc(ctypes.addressof(b), size), hx.MEM_DEVICE)[0] == hx.SUCCESS
    return c, b


@pytest.fixture
def pair8(transport):
    s = HixlPeer(8 * MiB, 0xAA, transport)
    c, b = client(8 * MiB)
    assert c.connect(s.name, 5000) == hx.SUCCESS
    yield s, c, b
    c.finalize()
    s.close()


def test_h44_read_8mib_in_512_descs(pair8):
    """H44: 8 MiB host buffer read as 512 x 16 KiB descs from another process; every byte is 0xAA."""
    s, c, b = pair8
    base = ctypes.addressof(b)
    descs = [hx.TransferOpDesc(base + i * 16384, s.addr + i * 16384, 16384) for i in range(512)]
    assert c.transfer_sync(s.name, hx.READ, descs, 30000) == hx.SUCCESS
    assert bytes(b) == b"\xaa" * (8 * MiB)
    assert c.disconnect(s.name) == hx.SUCCESS


def test_hostile_ranges_across_processes(pair8):
    """H31 across processes: out-of-region, overflowing and unregistered remote ranges are refused
    before any byte moves, for READ and WRITE."""
    s, c, b = pair8
    base, size = ctypes.addressof(b), 8 * MiB
    before = s.digest(s.addr, size)
    ctypes.memset(b, 0x11, size)
    bad = [
        [hx.TransferOpDesc(base, s.addr + size - 10, 11)],      # one byte past S's region
        [hx.TransferOpDesc(base, s.addr + 64 * MiB, 16)],        # not registered at all
        [hx.TransferOpDesc(base, s.addr, 2 ** 64 - 1)],          # length overflow
        [hx.TransferOpDesc(base + size - 10, s.addr, 11)],       # one byte past our own region
        [hx.TransferOpDesc(base, s.addr, 4096), hx.TransferOpDesc(base, s.addr - 4096, 4096)],
    ]
    for op in (hx.READ, hx.WRITE):
        for d in bad:
            assert c.transfer_sync(s.name, op, d) == hx.PARAM_INVALID, d
            assert c.transfer_async(s.name, op, d) == (hx.PARAM_INVALID, 0), d
    assert s.digest(s.addr, size) == before and bytes(b) == b"\x11" * size
    # memory S registers after the link is invisible to it (H33)
    late = s.call(op="register", size=4096, fill=0x42)["addr"]
    assert c.transfer_sync(s.name, hx.READ, [hx.TransferOpDesc(base, late, 4096)]) == hx.PARAM_INVALID


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_notify_after_transfers_sees_the_data(pair8, mode):
    """§1.13 ordering: S checks, the moment each notification arrives, that the bytes the client wrote
    before sending it are in its memory (async: the notify is sent right after submitting)."""
    s, c, b = pair8
    base = ctypes.addressof(b)
    rounds = 6
    s.send(op="watch", count=rounds)
    chunk = MiB
    for r in range(rounds):
        byte = 0x30 + r
        off = (r % 8) * chunk
        ctypes.memset(base + off, byte, chunk)
        descs = [hx.TransferOpDesc(base + off + o, s.addr + off + o, 16384) for o in range(0, chunk, 16384)]
        if mode == "sync":
            assert c.transfer_sync(s.name, hx.WRITE, descs, 10000) == hx.SUCCESS
        else:
            st, _ = c.transfer_async(s.name, hx.WRITE, descs)
            assert st == hx.SUCCESS
        assert c.send_notify(s.name, hx.NotifyDesc("blocks", f"{off}:{chunk}:{byte}"), 10000) == hx.SUCCESS
    assert s.reply()["checks"] == [True] * rounds


@pytest.fixture
def frozen_tcp(monkeypatch):
    monkeypatch.setenv("KVBLOCKS_TRANSPORT", "tcp")
    s = HixlPeer(32 * MiB, 0xAA, "tcp")
    c, b = client(32 * MiB, 0x00)
    assert c.connect(s.name, 5000) == hx.SUCCESS
    assert c.transfer_sync(s.name, hx.READ, [hx.TransferOpDesc(ctypes.addressof(b), s.addr, 4096)]) == hx.SUCCESS
    ctypes.memset(b, 0x00, 4096)
    yield s, c, b
    c.finalize()
    s.close()


def _freeze(s):
    os.kill(s.pid, signal.SIGSTOP)
    wait_stopped(s.pid)


def test_frozen_peer_read_times_out_without_late_writes(frozen_tcp):
    """A READ from a SIGSTOPped peer returns TIMEOUT near its deadline; after the peer resumes, no
    byte of our buffer changes."""
    s, c, b = frozen_tcp
    base = ctypes.addressof(b)
    _freeze(s)
    descs = [hx.TransferOpDesc(base + o, s.addr + o, MiB) for o in range(0, 32 * MiB, MiB)]
    t0 = time.monotonic()
    assert c.transfer_sync(s.name, hx.READ, descs, 300) == hx.TIMEOUT
    took = time.monotonic() - t0
    assert 0.25 < took < 2.0, took
    snap = sha(b)
    os.kill(s.pid, signal.SIGCONT)
    time.sleep(0.5)
    assert sha(b) == snap
    # the link is broken now, as after any timeout: the next transfer fails, a reconnect recovers
    assert c.transfer_sync(s.name, hx.READ, descs[:1]) == hx.FAILED
    assert c.disconnect(s.name) == hx.SUCCESS and c.connect(s.name, 5000) == hx.SUCCESS
    assert c.transfer_sync(s.name, hx.READ, descs[:1], 5000) == hx.SUCCESS


@pytest.mark.parametrize("n", [64 * 1024, 16 * MiB])
def test_frozen_peer_write_times_out_without_late_writes(frozen_tcp, n):
    """A WRITE into a SIGSTOPped peer returns TIMEOUT; the peer's memory, as it was when the call
    returned, does not change after it resumes (small inline writes and large ones)."""
    s, c, b = frozen_tcp
    base = ctypes.addressof(b)
    ctypes.memset(b, 0x55, n)
    _freeze(s)
    assert c.transfer_sync(s.name, hx.WRITE, [hx.TransferOpDesc(base, s.addr, n)], 300) == hx.TIMEOUT
    at_return = hashlib.sha256(read_process_memory(s.pid, s.addr, n)).hexdigest()
    os.kill(s.pid, signal.SIGCONT)
    time.sleep(0.5)
    assert s.digest(s.addr, n) == at_return


def test_h39_skip_waiting_with_a_stalled_peer(frozen_tcp):
    """H39: a request against a frozen peer stays WAITING: skip_waiting=True leaves it out,
    skip_waiting=False lists it; disconnecting forgets it (H40)."""
    s, c, b = frozen_tcp
    base = ctypes.addressof(b)
    _freeze(s)
    st, req = c.transfer_async(s.name, hx.READ, [hx.TransferOpDesc(base, s.addr, 16 * MiB)])
    assert st == hx.SUCCESS
    time.sleep(0.2)
    assert c.get_all_transfer_status(hx.GetTransferStatusArgs(skip_waiting=True)) == (hx.SUCCESS, [])
    st, res = c.get_all_transfer_status(hx.GetTransferStatusArgs(skip_waiting=False))
    assert st == hx.SUCCESS and [(r.req, r.status) for r in res] == [(req, hx.TransferStatus.WAITING)]
    assert c.get_transfer_status(req) == (hx.SUCCESS, hx.TransferStatus.WAITING)
    assert c.disconnect(s.name) == hx.SUCCESS
    assert c.get_transfer_status(req) == (hx.PARAM_INVALID, hx.TransferStatus.FAILED)
