# SPDX-License-Identifier: Apache-2.0
"""``python -m kvblocks bench``: the benchmark matrix, each case next to a baseline from the same run.

Groups (``--case`` takes a group name or a glob over case ids, repeatable):

  validation  block-list checks at 16/1k/64k/1M blocks vs a pure-Python loop
  dispatch    in-process pull_kv_blocks of 16 blocks vs a memcpy of the same bytes
  shm, cma    same-host cross-process pull/push (allocated caches use shared memory,
              registered numpy arrays use process_vm_readv/writev), small and large,
              random and contiguous ids, vs numpy memcpy and numpy block gather
  tcp         the same over kvblocks.Transport=tcp vs a raw socket and a raw 8-byte ping-pong
  scaling     time vs bytes per call, vs blocks per call at fixed bytes, vs layers
  import      ``import kvblocks`` in a fresh interpreter

The peer is a real second process (multiprocessing spawn) holding its own LlmDataDist.
``--vs nixl`` / ``--vs mooncake`` run the same-host and TCP cases through those engines
(optional; skipped with a message when they are not importable).

Examples::

  python -m kvblocks bench                         # everything (~2 minutes on 2 cores)
  python -m kvblocks bench --case shm --case tcp --json out.json --plot bw.png
  python -m kvblocks bench --case 'shm/small/*' --vs nixl
"""
from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import sys
import threading
import time

KiB = 1024
MiB = 1024 * 1024

# (layers, num_blocks, block_bytes, blocks per call); tensors = 2 * layers
SIZES = {
    "small": (2, 64, 4 * KiB, 4),
    "large": (32, 256, 64 * KiB, 64),
}
# per-size repetition policy: (warmup calls, min reps, max reps, time budget s)
REPS = {
    "small": (50, 200, 3000, 0.4),
    "large": (2, 8, 40, 0.6),
}
VALIDATION_NS = (16, 1024, 65536, 1048576)
SCALE_BLOCK_BYTES = (1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)
SCALE_FIXED_BYTES = 16 * MiB
SCALE_BLOCKS = (16, 1024, 65536, 1048576)
SCALE_BLOCKS_64B = (1024, 65536, 1048576)
SCALE_LAYERS = (1, 2, 4, 8, 16, 32, 64)
DISPATCH_SHAPES = ((4 * KiB, 1), (16, 1), (16, 4))  # (block bytes, tensors) of the in-process caches
TRANSPORT = {"shm": "auto", "cma": "auto", "tcp": "tcp"}
KIND = {"shm": "alloc", "cma": "reg", "tcp": "alloc"}


def _np():
    import numpy as np

    return np


# ----------------------------------------------------------------------------- markers
# Every transferred block is checked once per case: the source blocks of one extra call get a
# fresh marker (nonce, tensor, block) in their first and last 8 bytes, and the destination
# blocks must hold exactly those markers afterwards.
def _marker(nonce, t, ids):
    np = _np()
    return (np.uint64(nonce) << np.uint64(44)) | (np.uint64(t) << np.uint64(24)) | ids.astype(np.uint64)


def mark_blocks(arrays, ids, nonce):
    np = _np()
    ids = np.asarray(ids, dtype=np.int64)
    for t, a in enumerate(arrays):
        v = a.view(np.uint64)
        m = _marker(nonce, t, ids)
        v[ids, 0] = m
        v[ids, -1] = m


def check_blocks(arrays, dst_ids, src_ids, nonce):
    """Number of (tensor, block) pairs whose markers are wrong."""
    np = _np()
    dst_ids = np.asarray(dst_ids, dtype=np.int64)
    src_ids = np.asarray(src_ids, dtype=np.int64)
    bad = 0
    for t, a in enumerate(arrays):
        v = a.view(np.uint64)
        m = _marker(nonce, t, src_ids)
        bad += int(((v[dst_ids, 0] != m) | (v[dst_ids, -1] != m)).sum())
    return bad


def id_lists(rng, num_blocks, count, pattern, how_many):
    """``how_many`` (src, dst) uint64 block-id arrays of ``count`` distinct ids each."""
    np = _np()
    out = []
    for _ in range(how_many):
        if pattern == "contig":
            s = int(rng.integers(0, num_blocks - count + 1))
            d = int(rng.integers(0, num_blocks - count + 1))
            out.append((np.arange(s, s + count, dtype=np.uint64), np.arange(d, d + count, dtype=np.uint64)))
        elif count == num_blocks:
            out.append((rng.permutation(num_blocks).astype(np.uint64), rng.permutation(num_blocks).astype(np.uint64)))
        else:
            out.append((rng.choice(num_blocks, count, replace=False).astype(np.uint64),
                        rng.choice(num_blocks, count, replace=False).astype(np.uint64)))
    return out


# ----------------------------------------------------------------------------- peer process
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_cache(dd, kind, num_tensors, num_blocks, block_bytes):
    import kvblocks as kb

    np = _np()
    if kind == "alloc":
        c = dd.allocate_cache(kb.CacheDesc(num_tensors, kb.DataType.DT_UINT8, [num_blocks, block_bytes]))
        arrays = [c.numpy(i).reshape(num_blocks, block_bytes) for i in range(num_tensors)]
    else:
        arrays = [np.empty((num_blocks, block_bytes), dtype=np.uint8) for _ in range(num_tensors)]
        c = dd.register_arrays(arrays)
    for a in arrays:  # fault every page in, so no case measures first-touch page faults
        a.fill(0x5A)
    return c, arrays


def _free_cache(dd, kind, cache):
    if kind == "alloc":
        dd.deallocate_cache(cache)
    else:
        dd.unregister_kv_cache(cache)


def _raw_server(lsock):
    while True:
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        threading.Thread(target=_raw_conn, args=(conn,), daemon=True).start()


def _raw_conn(conn):
    """Loopback baselines: 'S' = sink (8-byte length, payload, 1-byte ack), 'P' = 8-byte echo."""
    buf = bytearray(1)
    if True:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = conn.recv(1)
        try:
            if mode == b"P":
                m = bytearray(8)
                mv = memoryview(m)
                while True:
                    got = 0
                    while got < 8:
                        k = conn.recv_into(mv[got:])
                        if not k:
                            raise EOFError
                        got += k
                    conn.sendall(m)
            else:
                hdr = bytearray(8)
                while True:
                    got = 0
                    while got < 8:
                        k = conn.recv_into(memoryview(hdr)[got:])
                        if not k:
                            raise EOFError
                        got += k
                    n = int.from_bytes(hdr, "little")
                    if len(buf) < n:
                        buf = bytearray(n)
                    mv = memoryview(buf)
                    got = 0
                    while got < n:
                        k = conn.recv_into(mv[got:min(n, got + 4 * MiB)])
                        if not k:
                            raise EOFError
                        got += k
                    conn.sendall(b"k")
        except (EOFError, OSError):
            conn.close()


def _peer_main(conn, cluster_id, transport):
    """The remote side: its own LlmDataDist (MIX) listening on loopback, driven over a Pipe."""
    import kvblocks as kb

    dd = kb.LlmDataDist(cluster_id, kb.LlmRole.MIX)
    for _ in range(20):
        port = free_port()
        try:
            dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}",
                           kb.OPTION_TRANSPORT: transport, kb.OPTION_SYNC_CACHE_WAIT_TIME: "60000"})
            break
        except Exception:  # port raced away: try another
            continue
    conn.send(("ok", port))
    caches = {}
    lsock = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        op = msg[0]
        try:
            if op == "alloc":
                key, kind, nt, nb, bb = msg[1:]
                c, arrays = _make_cache(dd, kind, nt, nb, bb)
                caches[key] = (kind, c, arrays)
                conn.send(("ok", c.cache_id))
            elif op == "free":
                kind, c, arrays = caches.pop(msg[1])
                del arrays
                _free_cache(dd, kind, c)
                conn.send(("ok", None))
            elif op == "mark":
                mark_blocks(caches[msg[1]][2], msg[2], msg[3])
                conn.send(("ok", None))
            elif op == "check":
                conn.send(("ok", check_blocks(caches[msg[1]][2], msg[2], msg[3], msg[4])))
            elif op == "addrs":
                conn.send(("ok", (os.getpid(), [a.ctypes.data for a in caches[msg[1]][2]])))
            elif op == "raw":
                if lsock is None:
                    lsock = socket.socket()
                    lsock.bind(("127.0.0.1", 0))
                    lsock.listen(8)
                    threading.Thread(target=_raw_server, args=(lsock,), daemon=True).start()
                conn.send(("ok", lsock.getsockname()[1]))
            elif op == "quit":
                conn.send(("ok", None))
                break
            else:
                conn.send(("error", f"unknown op {op!r}"))
        except Exception as e:  # report, keep serving
            conn.send(("error", f"{type(e).__name__}: {e}"))
    caches.clear()
    dd.finalize()


class _Peer:
    def __init__(self, ctx, cluster_id, transport):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(child, cluster_id, transport), daemon=True)
        self.proc.start()
        child.close()
        self.cluster_id = cluster_id
        self.port = self.call()

    def call(self, *msg, timeout=300):
        if msg:
            self.conn.send(msg)
        if not self.conn.poll(timeout):
            raise RuntimeError(f"benchmark peer did not answer {msg[:1]} within {timeout}s")
        st, val = self.conn.recv()
        if st != "ok":
            raise RuntimeError(f"benchmark peer: {val}")
        return val

    def close(self):
        try:
            self.call("quit", timeout=30)
        except Exception:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


class Pair:
    """A local cache and its remote counterpart, with the local LlmDataDist linked to the peer."""

    def __init__(self, h, path, nt, nb, bb):
        self.h, self.path, self.key = h, path, (path, nt, nb, bb)
        self.kind = KIND[path]
        self.nt, self.nb, self.bb = nt, nb, bb
        self.dd, self.peer = h.link(TRANSPORT[path])
        self.rkey = "%s-%d-%d-%d" % self.key
        rid = self.peer.call("alloc", self.rkey, self.kind, nt, nb, bb)
        h.relink(TRANSPORT[path])
        import kvblocks as kb

        self.index = kb.CacheIndex(self.peer.cluster_id, rid)
        self.cache, self.arrays = _make_cache(self.dd, self.kind, nt, nb, bb)
        self.bytes = nt * nb * bb

    def free(self):
        self.arrays = None
        _free_cache(self.dd, self.kind, self.cache)
        self.peer.call("free", self.rkey)


class Harness:
    """Peer processes, local LlmDataDists and cache pairs shared by the cases (CLI and pytest)."""

    MAX_HELD = 1536 * MiB  # bytes of cache pairs kept per side before older ones are freed

    def __init__(self):
        self.ctx = mp.get_context("spawn")
        self.peers = {}
        self.locals = {}
        self.pairs = {}
        self.inproc = None
        self._next_id = itertools.count(1)
        self.nonce = itertools.count(1)

    def link(self, transport):
        import kvblocks as kb

        if transport not in self.peers:
            peer = _Peer(self.ctx, 2000 + next(self._next_id), transport)
            dd = kb.LlmDataDist(1000 + next(self._next_id), kb.LlmRole.MIX)
            dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport,
                           kb.OPTION_SYNC_CACHE_WAIT_TIME: "60000"})
            self.peers[transport] = peer
            self.locals[transport] = dd
            self.relink(transport, first=True)
        return self.locals[transport], self.peers[transport]

    def relink(self, transport, first=False):
        """(Re)links to the peer. The runtime learns the peer's caches at link time, so a link is
        made again after the peer allocated a cache."""
        import kvblocks as kb

        dd, peer = self.locals[transport], self.peers[transport]
        ci = [kb.ClusterInfo(peer.cluster_id, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", peer.port)])]
        if not first:
            dd.unlink_llm_clusters(ci, 10000)
        rets = dd.link_llm_clusters(ci, 10000)
        if rets != [kb.Status.LLM_SUCCESS]:
            raise RuntimeError(f"link to the benchmark peer failed: {rets}")

    def link_path(self, transport):
        dd, peer = self.link(transport)
        return dd.link_path(peer.cluster_id)

    def pair(self, path, nt, nb, bb):
        key = (path, nt, nb, bb)
        p = self.pairs.pop(key, None)
        if p is None:
            need = nt * nb * bb
            while self.pairs and sum(x.bytes for x in self.pairs.values()) + need > self.MAX_HELD:
                self.pairs.pop(next(iter(self.pairs))).free()  # oldest first
            p = Pair(self, path, nt, nb, bb)
        self.pairs[key] = p  # most recently used last
        return p

    def raw_port(self):
        _, peer = self.link("tcp")
        return peer.call("raw")

    def inprocess(self):
        """Two LlmDataDists in this process, linked (path "inprocess")."""
        import kvblocks as kb

        if self.inproc is None:
            port = free_port()
            a = kb.LlmDataDist(1, kb.LlmRole.MIX)
            a.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
            b = kb.LlmDataDist(2, kb.LlmRole.MIX)
            b.initialize({kb.OPTION_DEVICE_ID: "0"})
            caches = {}
            for bb, nt in DISPATCH_SHAPES:  # before the link: the runtime learns caches at link time
                caches[(bb, nt)] = (a.allocate_cache(kb.CacheDesc(nt, kb.DataType.DT_UINT8, [64, bb])),
                                    b.allocate_cache(kb.CacheDesc(nt, kb.DataType.DT_UINT8, [64, bb])))
            rets = b.link_llm_clusters([kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)],
                                                       [kb.IpInfo("127.0.0.1", port)])], 10000)
            if rets != [kb.Status.LLM_SUCCESS]:
                raise RuntimeError(f"in-process link failed: {rets}")
            self.inproc = (a, b, caches)
        return self.inproc

    def close(self):
        for p in list(self.pairs.values()):
            try:
                p.free()
            except Exception:
                pass
        self.pairs.clear()
        for dd in self.locals.values():
            dd.finalize()
        if self.inproc is not None:
            self.inproc[1].finalize()
            self.inproc[0].finalize()
            self.inproc = None
        for p in self.peers.values():
            p.close()
        self.peers.clear()
        self.locals.clear()


# ----------------------------------------------------------------------------- cases
class Case:
    """One row. ``make(h)`` returns ``(fn, verify)``: ``fn()`` runs one call, ``verify()`` (or None)
    returns the number of bad blocks after one extra checked call."""

    def __init__(self, id, group, make, *, baseline=None, bytes=0, blocks=0, reps="small",
                 path="", fast=False, note="", pgroup=None, series=None):
        self.id, self.group, self.make, self.baseline = id, group, make, baseline
        self.bytes, self.blocks, self.reps, self.path = bytes, blocks, reps, path
        self.fast = fast  # sub-10us: time batches of calls
        self.note = note
        self.pgroup = pgroup or group  # pytest-benchmark group
        self.series = series
        self.custom = None  # a function(h) -> samples in seconds (import times)

    def __repr__(self):
        return self.id


def _transfer_case(path, size, direction, pattern):
    L, nb, bb, B = SIZES[size]

    def make(h):
        p = h.pair(path, 2 * L, nb, bb)
        np = _np()
        rng = np.random.default_rng(hash((path, size, direction, pattern)) & 0xFFFF)
        lists = id_lists(rng, nb, B, pattern, 64)
        return _transfer_fns(h, p, direction, lists, rng, pattern, B)

    return Case(f"{path}/{size}/{direction}/{pattern}", path, make, baseline=_base_for(path, size, pattern),
                bytes=2 * L * B * bb, blocks=2 * L * B, reps=size, path=path,
                pgroup=f"{'tcp' if path == 'tcp' else 'samehost'}-{size}")


def _transfer_fns(h, p, direction, lists, rng, pattern, B, ext=None):
    dd, idx, cache = p.dd, p.index, p.cache
    it = itertools.cycle(lists)
    if direction == "pull":
        pull = dd.pull_kv_blocks

        def fn():
            s, d = next(it)
            pull(idx, cache, s, d, ext)
    else:
        push = dd.push_kv_blocks

        def fn():
            s, d = next(it)
            push(cache, idx, s, d, ext)

    def verify():
        s, d = id_lists(rng, p.nb, B, pattern, 1)[0]
        nonce = next(h.nonce)
        if direction == "pull":
            p.peer.call("mark", p.rkey, s, nonce)
            dd.pull_kv_blocks(idx, cache, s, d)
            return check_blocks(p.arrays, d, s, nonce)
        mark_blocks(p.arrays, s, nonce)
        dd.push_kv_blocks(cache, idx, s, d)
        return p.peer.call("check", p.rkey, d, s, nonce)

    return fn, verify


def _base_for(path, size, pattern):
    if path == "tcp":
        return "tcp/raw-pingpong-8B" if size == "small" else f"tcp/raw-send/{size}"
    return f"base/gather/{size}/{pattern}"


def _memcpy_case(nbytes, id=None, group="base", pgroup=None, reps=None):
    def make(h):
        np = _np()
        src = np.full(nbytes, 7, dtype=np.uint8)
        dst = np.zeros(nbytes, dtype=np.uint8)
        copyto = np.copyto
        return (lambda: copyto(dst, src)), None

    rep = reps or ("large" if nbytes >= 16 * MiB else "small")
    return Case(id or f"base/memcpy/{_hb(nbytes)}", group, make, bytes=nbytes, reps=rep,
                fast=nbytes <= 256 * KiB, pgroup=pgroup)


def _gather_case(size, pattern):
    L, nb, bb, B = SIZES[size]

    def make(h):
        np = _np()
        rng = np.random.default_rng(7)
        src = [np.full((nb, bb), t, dtype=np.uint8) for t in range(2 * L)]
        out = np.zeros((2 * L, B, bb), dtype=np.uint8)
        lists = [(s.astype(np.intp), d) for s, d in id_lists(rng, nb, B, pattern, 64)]
        it = itertools.cycle(lists)
        take = np.take

        def fn():
            s, _ = next(it)
            for t in range(2 * L):
                take(src[t], s, axis=0, out=out[t], mode="clip")  # "raise" would buffer out (2 copies)
        return fn, None

    return Case(f"base/gather/{size}/{pattern}", "base", make, bytes=2 * L * B * bb, blocks=2 * L * B,
                reps=size, note="np.take of the blocks into a staging array, one process",
                pgroup=f"samehost-{size}")


def _raw_cma_case(size, direction, pattern):
    """process_vm_readv/writev through ctypes on the same blocks of the peer's registered arrays:
    one iovec per block, 1024 per syscall, iovecs built before timing (the kernel's CMA cost)."""
    L, nb, bb, B = SIZES[size]

    def make(h):
        import ctypes

        np = _np()
        p = h.pair("cma", 2 * L, nb, bb)
        pid, raddrs = p.peer.call("addrs", p.rkey)
        libc = ctypes.CDLL(None, use_errno=True)
        f = libc.process_vm_readv if direction == "pull" else libc.process_vm_writev
        f.restype = ctypes.c_ssize_t
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        la = np.array([a.ctypes.data for a in p.arrays], dtype=np.uint64)[:, None]
        ra = np.array(raddrs, dtype=np.uint64)[:, None]
        rng = np.random.default_rng(3)
        prepared = []
        for s, d in id_lists(rng, nb, B, pattern, 8):
            remote, local = (s, d) if direction == "pull" else (d, s)
            liov = np.empty((2 * L * B, 2), dtype=np.uint64)
            riov = np.empty((2 * L * B, 2), dtype=np.uint64)
            liov[:, 0] = (la + local[None, :] * np.uint64(bb)).ravel()
            riov[:, 0] = (ra + remote[None, :] * np.uint64(bb)).ravel()
            liov[:, 1] = bb
            riov[:, 1] = bb
            prepared.append((liov, riov))
        it = itertools.cycle(prepared)
        n = 2 * L * B

        def fn():
            liov, riov = next(it)
            lp, rp = liov.ctypes.data, riov.ctypes.data
            for k in range(0, n, 1024):
                m = min(1024, n - k)
                if f(pid, lp + k * 16, m, rp + k * 16, m, 0) != m * bb:
                    raise OSError(ctypes.get_errno(), "process_vm_readv/writev failed")
        return fn, None

    return Case(f"base/raw-cma/{size}/{direction}/{pattern}", "cma", make, baseline=_base_for("cma", size, pattern),
                bytes=2 * L * B * bb, blocks=2 * L * B, reps=size, path="raw",
                note="ctypes process_vm_readv/writev, 1 iovec per block, iovecs prebuilt",
                pgroup=f"samehost-{size}")


def _raw_send_case(size):
    L, nb, bb, B = SIZES[size]
    nbytes = 2 * L * B * bb

    def make(h):
        port = h.raw_port()
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"S")
        payload = bytearray(nbytes)
        hdr = nbytes.to_bytes(8, "little")
        h._sockets = getattr(h, "_sockets", []) + [s]

        def fn():
            s.sendall(hdr)
            s.sendall(payload)
            if s.recv(1) != b"k":
                raise RuntimeError("raw sink: bad ack")
        return fn, None

    return Case(f"tcp/raw-send/{size}", "tcp", make, bytes=nbytes, reps=size, path="raw",
                note="Python sendall of the same bytes to the peer process + 1-byte ack", pgroup=f"tcp-{size}")


def _pingpong_case():
    def make(h):
        port = h.raw_port()
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"P")
        h._sockets = getattr(h, "_sockets", []) + [s]
        msg = b"12345678"

        def fn():
            s.sendall(msg)
            got = s.recv(8)
            while len(got) < 8:
                got += s.recv(8 - len(got))
        return fn, None

    return Case("tcp/raw-pingpong-8B", "tcp", make, bytes=8, reps="small", path="raw",
                note="8-byte request/response round trip, TCP_NODELAY, Python", pgroup="tcp-small")


def _gather_rows_case(n, bb, pgroup):
    """numpy gather of n random rows of bb bytes (np.take into a staging array), one process."""
    def make(h):
        np = _np()
        rng = np.random.default_rng(n)
        src = np.full((n, bb), 3, dtype=np.uint8)
        out = np.zeros((n, bb), dtype=np.uint8)
        perms = [rng.permutation(n) for _ in range(3)]
        it = itertools.cycle(perms)
        take = np.take
        return (lambda: take(src, next(it), axis=0, out=out, mode="clip")), None

    return Case(f"base/gather/{n}x{_hb(bb)}", "base", make, bytes=n * bb, blocks=n,
                reps="large" if n * bb >= 4 * MiB or n >= 65536 else "small", pgroup=pgroup,
                note="np.take of n random rows into a staging array, one process")


def _validation_cases():
    out = []
    for n in VALIDATION_NS:
        def mk_nd(h, n=n):
            np = _np()
            rng = np.random.default_rng(n)
            s = rng.integers(0, n, n).astype(np.uint64)
            d = rng.integers(0, n, n).astype(np.uint64)
            import kvblocks as kb
            v = kb.validate_blocks
            return (lambda: v(s, d, n)), None

        def mk_list(h, n=n):
            np = _np()
            rng = np.random.default_rng(n)
            s = rng.integers(0, n, n).tolist()
            d = rng.integers(0, n, n).tolist()
            import kvblocks as kb
            v = kb.validate_blocks
            return (lambda: v(s, d, n)), None

        def mk_py(h, n=n):
            np = _np()
            rng = np.random.default_rng(n)
            s = rng.integers(0, n, n).tolist()
            d = rng.integers(0, n, n).tolist()
            return (lambda: _py_validate(s, d, n)), None

        g = f"validation-{n}"
        out.append(Case(f"validation/python/{n}", "validation", mk_py, blocks=n, fast=n < 4096, pgroup=g,
                        reps="small" if n < 65536 else "large", note="pure-Python loop, list input"))
        out.append(Case(f"validation/ndarray/{n}", "validation", mk_nd, baseline=f"validation/python/{n}",
                        blocks=n, fast=n < 65536, pgroup=g, reps="small" if n < 65536 else "large",
                        note="kb.validate_blocks, numpy uint64"))
        out.append(Case(f"validation/list/{n}", "validation", mk_list, baseline=f"validation/python/{n}",
                        blocks=n, fast=n < 4096, pgroup=g, reps="small" if n < 65536 else "large",
                        note="kb.validate_blocks, Python list"))
    return out


def _py_validate(src, dst, limit):
    if not src or len(src) != len(dst):
        raise ValueError("bad lengths")
    for x in src:
        if type(x) is not int or x < 0:
            raise ValueError(x)
    for x in dst:
        if type(x) is not int or x < 0 or x >= limit:
            raise ValueError(x)


def _dispatch_cases():
    def mk(bb, nt, as_list, layers):
        def make(h):
            import kvblocks as kb

            np = _np()
            a, b, caches = h.inprocess()
            rc, lc = caches[(bb, nt)]
            n = 16 // nt
            s = np.arange(0, 4 * n, 4, dtype=np.uint64)
            d = np.arange(1, 4 * n + 1, 4, dtype=np.uint64)[::-1].copy()
            if as_list:
                s, d = s.tolist(), d.tolist()
            idx = kb.CacheIndex(1, rc.cache_id)
            ext = kb.KvCacheExtParam((1, 1), (1, 1), 2) if layers else None
            pull = b.pull_kv_blocks
            if ext is None:
                fn = lambda: pull(idx, lc, s, d)  # noqa: E731
            else:
                fn = lambda: pull(idx, lc, s, d, ext)  # noqa: E731

            def verify():
                ra = [rc.numpy(i).reshape(64, bb) for i in range(nt)]
                la = [lc.numpy(i).reshape(64, bb) for i in range(nt)]
                nonce = next(h.nonce)
                mark_blocks(ra, s, nonce)
                fn()
                sel = slice(2, 4) if layers else slice(0, nt)
                return check_blocks(la[sel], d, s, nonce) if not layers else _check_sel(la, ra, s, d, sel)
            return fn, verify
        return make

    return [
        Case("dispatch/memcpy-64KiB", "dispatch", _memcpy_case(64 * KiB).make, bytes=64 * KiB, fast=True,
             note="np.copyto of 64 KiB"),
        Case("dispatch/pull-16x4KiB", "dispatch", mk(4 * KiB, 1, False, False), baseline="dispatch/memcpy-64KiB",
             bytes=64 * KiB, blocks=16, fast=True, path="inprocess", note="1 tensor, 16 random-ish blocks"),
        Case("dispatch/memcpy-256B", "dispatch", _memcpy_case(256).make, bytes=256, fast=True,
             note="np.copyto of 256 B"),
        Case("dispatch/pull-16x16B", "dispatch", mk(16, 1, False, False), baseline="dispatch/memcpy-256B",
             bytes=256, blocks=16, fast=True, path="inprocess",
             note="validation + call, no real data (16-byte blocks), ndarray ids"),
        Case("dispatch/pull-16x16B-list", "dispatch", mk(16, 1, True, False), baseline="dispatch/memcpy-256B",
             bytes=256, blocks=16, fast=True, path="inprocess", note="as above, Python-list ids"),
        Case("dispatch/pull-4x16B-layer1of2", "dispatch", mk(16, 4, False, True), baseline="dispatch/memcpy-256B",
             bytes=128, blocks=8, fast=True, path="inprocess",
             note="4 tensors, layer range (1,1): layer math + 8 copies"),
    ]


def _check_sel(la, ra, s, d, sel):
    np = _np()
    bad = 0
    for t in range(len(la))[sel]:
        bad += int((la[t][np.asarray(d, np.int64)] != ra[t][np.asarray(s, np.int64)]).any(axis=1).sum())
    return bad


def _scaling_cases():
    out = []
    for path in ("shm", "cma", "tcp"):
        for bb in SCALE_BLOCK_BYTES:
            nbytes = 64 * bb

            def make(h, path=path, bb=bb):
                np = _np()
                p = h.pair(path, 1, 256, bb)
                rng = np.random.default_rng(bb)
                return _transfer_fns(h, p, "pull", id_lists(rng, 256, 64, "random", 16), rng, "random", 64)
            out.append(Case(f"scaling/bytes/{path}/{_hb(nbytes)}", "scaling", make, baseline=f"base/memcpy/{_hb(nbytes)}",
                            bytes=nbytes, blocks=64, reps="large" if nbytes >= 16 * MiB else "small", path=path,
                            pgroup=f"scaling-bytes-{path}", series=f"kvblocks {path} pull",
                            note="1 tensor, 64 random blocks per call"))
    for n in SCALE_BLOCKS:
        bb = SCALE_FIXED_BYTES // n

        def make(h, n=n, bb=bb):
            np = _np()
            p = h.pair("shm", 1, n, bb)
            rng = np.random.default_rng(n)
            return _transfer_fns(h, p, "pull", id_lists(rng, n, n, "random", 3), rng, "random", n)
        out.append(Case(f"scaling/blocks/shm/{n}x{_hb(bb)}", "scaling", make,
                        baseline=f"base/gather/{n}x{_hb(bb)}", bytes=SCALE_FIXED_BYTES, blocks=n,
                        reps="large", path="shm", pgroup="scaling-blocks-16MiB",
                        note="fixed 16 MiB per call, 1 tensor, random permutation"))
    for n in SCALE_BLOCKS_64B:
        def make(h, n=n):
            np = _np()
            p = h.pair("shm", 1, n, 64)
            rng = np.random.default_rng(n + 1)
            return _transfer_fns(h, p, "pull", id_lists(rng, n, n, "random", 3), rng, "random", n)
        out.append(Case(f"scaling/blocks/shm/{n}x64B", "scaling", make, baseline=f"base/gather/{n}x64B",
                        bytes=64 * n, blocks=n, reps="large" if n > 1024 else "small", path="shm",
                        pgroup="scaling-blocks-64B", note="64-byte blocks: per-block cost"))
    for L in SCALE_LAYERS:
        nbytes = 2 * L * 4 * 16 * KiB

        def make(h, L=L):
            np = _np()
            p = h.pair("shm", 2 * L, 64, 16 * KiB)
            rng = np.random.default_rng(L)
            return _transfer_fns(h, p, "pull", id_lists(rng, 64, 4, "random", 32), rng, "random", 4)
        out.append(Case(f"scaling/layers/shm/{L}", "scaling", make, baseline=f"base/memcpy/{_hb(nbytes)}",
                        bytes=nbytes, blocks=2 * L * 4, reps="small" if L <= 16 else "large", path="shm",
                        pgroup="scaling-layers", note=f"{L} layers x 2 tensors, 4 random 16 KiB blocks"))
    return out


def _import_case(module, baseline=None):
    code = ("import sys, time; t = time.perf_counter(); import %s; t = time.perf_counter() - t; "
            "print(t, 'numpy' in sys.modules)" % module)

    def env():
        e = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        e["PYTHONPATH"] = root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
        return e

    def run_once():
        # Run outside any source checkout, so the kvblocks measured is the one this process imported.
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(),
                             check=True, cwd=tempfile.gettempdir()).stdout.split()
        return float(out[0]), out[1] == "True"

    def make(h):
        check = (lambda: int(run_once()[1])) if module == "kvblocks" else None  # "bad" = numpy was imported
        return (lambda: run_once()), check

    def custom(h, n=15):
        run_once()
        return [run_once()[0] for _ in range(n)]

    c = Case(f"import/{module}", "import", make, baseline=baseline, reps="large", pgroup="import",
             note="time inside a fresh interpreter" + ("; numpy must not be imported" if module == "kvblocks" else ""))
    c.custom = custom
    return c


def _hb(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return f"{n}B"


def all_cases():
    """Every case, baselines included, in run order (pairs grouped to limit allocation churn)."""
    cases = _validation_cases() + _dispatch_cases()
    for size in ("small", "large"):
        for pattern in ("random", "contig"):
            cases.append(_gather_case(size, pattern))
        cases.append(_memcpy_case(2 * SIZES[size][0] * SIZES[size][3] * SIZES[size][2], pgroup=f"samehost-{size}"))
    for path in ("shm", "cma", "tcp"):
        if path == "tcp":
            cases.append(_pingpong_case())
        for size in ("small", "large"):
            if path == "tcp":
                cases.append(_raw_send_case(size))
            if path == "cma":
                for direction in ("pull", "push"):
                    cases.append(_raw_cma_case(size, direction, "random"))
            for direction in ("pull", "push"):
                for pattern in ("random", "contig"):
                    cases.append(_transfer_case(path, size, direction, pattern))
    scaling = _scaling_cases()
    have = {c.id for c in cases}
    for c in scaling:
        if c.baseline and c.baseline not in have:
            if c.baseline.startswith("base/gather/"):
                cases.append(_gather_rows_case(c.blocks, c.bytes // c.blocks, c.pgroup))
            else:
                cases.append(_memcpy_case(c.bytes))
            have.add(c.baseline)
    cases += scaling
    cases.append(_import_case("json"))
    cases.append(_import_case("kvblocks", baseline="import/json"))
    # mark base rows used by a group with that group's pytest group
    by_id = {c.id: c for c in cases}
    for c in cases:
        if c.baseline and by_id[c.baseline].pgroup == "base" and c.group != "base":
            by_id[c.baseline].pgroup = c.pgroup
    return cases


def select(cases, patterns):
    """Cases matching any pattern (group name or glob on the id), plus their baselines."""
    if not patterns:
        return list(cases)
    want = set()
    by_id = {c.id: c for c in cases}
    for c in cases:
        for pat in patterns:
            if c.group == pat or fnmatch.fnmatch(c.id, pat) or c.id.startswith(pat.rstrip("/") + "/"):
                want.add(c.id)
                if c.baseline:
                    want.add(c.baseline)
    if not want:
        raise SystemExit(f"no case matches {patterns}; groups: {sorted({c.group for c in cases})}")
    for b in list(want):  # baselines of baselines
        if by_id[b].baseline:
            want.add(by_id[b].baseline)
    return [c for c in cases if c.id in want]


def cases_for(patterns, extra=()):
    """Cases matching ``patterns``, their same-run baselines and the ``extra`` ids, in run order."""
    every = all_cases()
    chosen = {c.id for c in select(every, list(patterns))} | set(extra)
    return [c for c in every if c.id in chosen]


# ----------------------------------------------------------------------------- measuring
def measure(fn, reps="small", fast=False, scale=1.0):
    """Samples (seconds per call). Fast cases are timed in batches calibrated to ~100 us."""
    warm, lo, hi, budget = REPS[reps]
    perf = time.perf_counter
    t0 = perf()
    for _ in range(max(1, int(warm * min(1.0, scale)))):
        fn()
    one = (perf() - t0) / max(1, warm)
    batch = 1
    if fast and one < 20e-6:
        batch = max(1, min(1000, int(100e-6 / max(one, 50e-9))))
    samples = []
    budget *= scale
    lo = max(3, int(lo * min(1.0, scale)))
    end = perf() + budget
    rng = range(batch)
    while len(samples) < hi and (len(samples) < lo or perf() < end):
        t = perf()
        if batch == 1:
            fn()
        else:
            for _ in rng:
                fn()
        samples.append((perf() - t) / batch)
    return samples


def measure_paired(fn, bfn, reps="small", fast=False, scale=1.0):
    """Samples of ``fn`` and of its baseline ``bfn``, taken in alternating batches so that a load
    change on a shared machine hits both alike; returns (samples, baseline samples)."""
    warm, lo, hi, budget = REPS[reps]
    perf = time.perf_counter

    def calibrate(f):
        n = max(1, int(warm * min(1.0, scale)))
        t0 = perf()
        for _ in range(n):
            f()
        one = (perf() - t0) / n
        batch = max(1, min(1000, int(100e-6 / max(one, 50e-9)))) if fast and one < 20e-6 else 1
        # consecutive samples per turn: ~2 ms per side, so latency cases keep their caches warm
        return batch, max(1, min(200, int(2e-3 / max(one * batch, 1e-7))))

    (batch, chunk), (bbatch, bchunk) = calibrate(fn), calibrate(bfn)
    samples, bsamples = [], []
    lo = max(3, int(lo * min(1.0, scale)))
    end = perf() + 2 * budget * scale

    def turn(f, k, m, out):
        r = range(k)
        for _ in range(m):
            if k == 1:
                t = perf()
                f()
                out.append(perf() - t)
            else:
                t = perf()
                for _ in r:
                    f()
                out.append((perf() - t) / k)

    while len(samples) < hi and (len(samples) < lo or perf() < end):
        turn(fn, batch, chunk, samples)
        turn(bfn, bbatch, bchunk, bsamples)
    return samples, bsamples


def summarize(samples):
    s = sorted(samples)

    def q(p):
        if len(s) == 1:
            return s[0]
        k = (len(s) - 1) * p
        f = math.floor(k)
        return s[f] + (s[min(f + 1, len(s) - 1)] - s[f]) * (k - f)
    return {"median_s": statistics.median(s), "p10_s": q(0.10), "p90_s": q(0.90), "min_s": s[0], "n": len(s)}


class Progress:
    def __init__(self, total, enabled=True):
        self.total, self.i, self.t0 = total, 0, time.perf_counter()
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled

    def step(self, label):
        self.i += 1
        if not self.enabled:
            return
        el = time.perf_counter() - self.t0
        if self.tty:
            w = 30
            k = int(w * (self.i - 1) / max(1, self.total))
            sys.stderr.write(f"\r[{'#' * k}{'.' * (w - k)}] {self.i}/{self.total} {el:5.0f}s {label[:48]:<48}")
        else:
            sys.stderr.write(f"[{self.i:3d}/{self.total}] {el:5.0f}s {label}\n")
        sys.stderr.flush()

    def done(self):
        if self.enabled and self.tty:
            sys.stderr.write(f"\r{' ' * 100}\r")
            sys.stderr.flush()


def run_cases(cases, h, scale=1.0, progress=True, paired=True):
    rows = []
    bar = Progress(len(cases), progress)
    by_id = {c.id: c for c in cases}
    made = {}  # baseline id -> fn, made once
    for c in cases:
        bar.step(c.id)
        row = {"id": c.id, "group": c.group, "section": _section(c), "path": c.path, "bytes": c.bytes, "blocks": c.blocks,
               "baseline": c.baseline, "note": c.note, "engine": "kvblocks" if c.group != "base" else "numpy"}
        try:
            if c.custom is not None:
                samples = c.custom(h)
                fn, verify = c.make(h)
            else:
                fn, verify = c.make(h)
                b = by_id.get(c.baseline or "")
                if paired and b is not None and b.custom is None:
                    if b.id not in made:
                        made[b.id] = b.make(h)[0]
                    samples, bs = measure_paired(fn, made[b.id], c.reps, c.fast or b.fast, scale)
                    row["paired_baseline_median_s"] = statistics.median(bs)
                else:
                    samples = measure(fn, c.reps, c.fast, scale)
                if c.group == "base":
                    made[c.id] = fn
            row.update(summarize(samples))
            if verify is not None:
                row["bad_blocks"] = verify()
            if c.path in ("shm", "cma", "tcp"):
                row["link_path"] = h.link_path(TRANSPORT[c.path])
        except Exception as e:  # keep going; the row says why
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    bar.done()
    _derive(rows)
    return rows


SECTIONS = (("validation", "Validation: block-list checks vs a pure-Python loop"),
            ("dispatch", "In-process dispatch: pull_kv_blocks vs memcpy of the same bytes"),
            ("samehost", "Same host, cross-process (shm: allocated caches; cma: registered numpy arrays)"),
            ("tcp", "TCP (kvblocks.Transport=tcp) vs a raw loopback socket"),
            ("scaling", "Scaling (shm unless named; pull, random ids)"),
            ("import", "import kvblocks in a fresh interpreter"))


def _section(c):
    for key, _ in SECTIONS:
        if c.pgroup.startswith(key):
            return key
    return "other"


def markdown(rows, peer_rows, tg, skipped=()):
    """The tables as Markdown, one per section (what bench/RESULTS.md holds)."""
    out = []
    if tg:
        out += ["### Targets", "", targets_table(tg, True), ""]
    for key, title in SECTIONS:
        sec = [r for r in rows if r.get("section") == key]
        if sec:
            out += [f"### {title}", "", table(sec, True), ""]
    if peer_rows:
        out += ["### Peer engines, same cases, same run", "", table(peer_rows, True), ""]
    out += [f"- {s}" for s in skipped]
    return "\n".join(out) + "\n"


def _derive(rows):
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        med = r.get("median_s")
        if not med:
            continue
        if r["bytes"] and r["bytes"] > 8:
            r["GBps"] = r["bytes"] / med / 1e9
        if r["blocks"]:
            r["ns_per_block"] = med / r["blocks"] * 1e9
        b = by_id.get(r.get("baseline") or "")
        if r.get("paired_baseline_median_s"):  # interleaved with the case: the robust ratio
            r["ratio"] = med / r["paired_baseline_median_s"]
        elif b and b.get("median_s"):
            r["ratio"] = med / b["median_s"]  # time ratio: < 1 is faster than the baseline


# ----------------------------------------------------------------------------- peer engines
PEER_ENGINES = ("nixl", "nixl-tcp", "mooncake")


def _engine_env(engine):
    env = {"UCX_MODULES": "^ib", "NIXL_LOG_LEVEL": "WARN", "GLOG_minloglevel": "2",
           "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "16384"}
    if engine == "nixl-tcp":
        env["UCX_TLS"] = "tcp"
    return env


def engine_available(engine):
    """(True, "") or (False, why), probed in a child process (imports can crash or pollute)."""
    code = {"nixl": "import nixl_cu12._api" if _has("nixl_cu12") else "import nixl._api",
            "mooncake": "from mooncake.engine import TransferEngine"}[engine.split("-")[0]]
    env = dict(os.environ, **_engine_env(engine))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return True, ""


def _has(mod):
    import importlib.util

    return importlib.util.find_spec(mod) is not None


class _NixlDriver:
    def __init__(self, name, initiator):
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError:
            from nixl._api import nixl_agent, nixl_agent_config
        # the initiator polls itself (the faster setting on 2 cores, see peers.md); the target
        # keeps its progress thread because it never polls
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=not initiator, backends=["UCX"]))
        self.regs = []

    def expose(self, arrays):
        self.regs.append(self.agent.register_memory([(a.ctypes.data, a.nbytes, 0, "") for a in arrays], "DRAM"))
        return {"md": self.agent.get_agent_metadata(), "addrs": [a.ctypes.data for a in arrays]}

    def prepare(self, arrays, info, nb, bb):
        np = _np()
        self.remote = self.agent.add_remote_agent(info["md"])

        def descs(addrs):
            d = np.empty((len(addrs) * nb, 3), dtype=np.uint64)
            for t, base in enumerate(addrs):
                d[t * nb:(t + 1) * nb, 0] = base + np.arange(nb, dtype=np.uint64) * np.uint64(bb)
            d[:, 1] = bb
            d[:, 2] = 0
            return d
        self.lh = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs([a.ctypes.data for a in arrays]), "DRAM")
        self.rh = self.agent.prep_xfer_dlist(self.remote, descs(info["addrs"]), "DRAM")
        self.off = (np.arange(len(arrays), dtype=np.int32) * nb)[:, None]
        try:
            self.agent.make_connection(self.remote)
        except Exception:
            pass

    def xfer(self, op, local_ids, remote_ids):
        li = (self.off + local_ids[None, :]).ravel()
        ri = (self.off + remote_ids[None, :]).ravel()
        h = self.agent.make_prepped_xfer(op, self.lh, li, self.rh, ri, b"")
        st = self.agent.transfer(h)
        while st == "PROC":
            st = self.agent.check_xfer_state(h)
        h.release()
        if st != "DONE":
            raise RuntimeError(f"nixl transfer state {st}")

    def unprepare(self):
        self.lh.release()
        self.rh.release()
        self.agent.remove_remote_agent(self.remote)

    def unexpose(self):
        for r in self.regs:
            self.agent.deregister_memory(r)
        self.regs = []


class _MooncakeDriver:
    def __init__(self, name, initiator):
        from mooncake.engine import TransferEngine

        self.e = TransferEngine()
        if self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("mooncake initialize failed")
        self.bufs = []

    def expose(self, arrays):
        addrs = [a.ctypes.data for a in arrays]
        if self.e.batch_register_memory(addrs, [a.nbytes for a in arrays]) != 0:
            raise RuntimeError("mooncake register failed")
        self.bufs.append(addrs)
        return {"session": "127.0.0.1:%d" % self.e.get_rpc_port(), "addrs": addrs}

    def prepare(self, arrays, info, nb, bb):
        np = _np()
        self.session = info["session"]
        self.la = np.array([a.ctypes.data for a in arrays], dtype=np.uint64)[:, None]
        self.ra = np.array(info["addrs"], dtype=np.uint64)[:, None]
        self.bb = np.uint64(bb)

    def xfer(self, op, local_ids, remote_ids):
        np = _np()
        loc = (self.la + local_ids.astype(np.uint64)[None, :] * self.bb).ravel().tolist()
        rem = (self.ra + remote_ids.astype(np.uint64)[None, :] * self.bb).ravel().tolist()
        lens = [int(self.bb)] * len(loc)
        f = self.e.batch_transfer_sync_read if op == "READ" else self.e.batch_transfer_sync_write
        rc = f(self.session, loc, rem, lens)
        if rc != 0:
            raise RuntimeError(f"mooncake transfer rc {rc}")

    def unprepare(self):
        pass

    def unexpose(self):
        for addrs in self.bufs:
            self.e.batch_unregister_memory(addrs)
        self.bufs = []


def _driver(engine, name, initiator):
    return (_MooncakeDriver if engine == "mooncake" else _NixlDriver)(name, initiator)


def _quiet_stderr():
    """Engines log to fd 2 from C++ (glog, UCX); their errors reach us through the pipe instead."""
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)


def _engine_target(conn, engine):
    os.environ.update(_engine_env(engine))
    _quiet_stderr()
    drv = _driver(engine, "target", False)
    arrays = None
    while True:
        msg = conn.recv()
        op = msg[0]
        try:
            if op == "alloc":
                if arrays is not None:
                    drv.unexpose()
                nt, nb, bb = msg[1:]
                np = _np()
                arrays = [np.full((nb, bb), 0x5A, dtype=np.uint8) for _ in range(nt)]
                conn.send(("ok", drv.expose(arrays)))
            elif op == "mark":
                mark_blocks(arrays, msg[1], msg[2])
                conn.send(("ok", None))
            elif op == "check":
                conn.send(("ok", check_blocks(arrays, msg[1], msg[2], msg[3])))
            elif op == "quit":
                conn.send(("ok", None))
                break
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
    os._exit(0)  # engine teardown at interpreter exit has crashed in the past (peers.md)


def _engine_initiator(conn, engine, specs, scale):
    """Runs [(id, size, direction, pattern)] through ``engine``; sends back rows."""
    os.environ.update(_engine_env(engine))
    _quiet_stderr()
    np = _np()
    ctx = mp.get_context("spawn")
    tconn, child = ctx.Pipe()
    proc = ctx.Process(target=_engine_target, args=(child, engine))
    proc.start()

    def tcall(*msg):
        tconn.send(msg)
        if not tconn.poll(300):
            raise RuntimeError("engine target did not answer")
        st, val = tconn.recv()
        if st != "ok":
            raise RuntimeError(val)
        return val

    rows = []
    try:
        drv = _driver(engine, "initiator", True)
        cur = None
        arrays = None
        for cid, size, direction, pattern in specs:
            row = {"id": cid, "engine": engine, "size": size, "dir": direction, "pattern": pattern}
            try:
                L, nb, bb, B = SIZES[size]
                if cur != size:
                    if cur is not None:
                        drv.unprepare()
                        drv.unexpose()
                    arrays = [np.full((nb, bb), 0x5A, dtype=np.uint8) for _ in range(2 * L)]
                    drv.expose(arrays)
                    info = tcall("alloc", 2 * L, nb, bb)
                    drv.prepare(arrays, info, nb, bb)
                    cur = size
                op = "READ" if direction == "pull" else "WRITE"
                rng = np.random.default_rng(11)
                lists = [(s.astype(np.int32), d.astype(np.int32)) for s, d in id_lists(rng, nb, B, pattern, 64)]
                it = itertools.cycle(lists)
                if direction == "pull":
                    def fn():
                        s, d = next(it)
                        drv.xfer(op, d, s)
                else:
                    def fn():
                        s, d = next(it)
                        drv.xfer(op, s, d)
                row.update(summarize(measure(fn, size, False, scale)))
                s, d = [x.astype(np.int32) for x in id_lists(rng, nb, B, pattern, 1)[0]]
                nonce = 999
                if direction == "pull":
                    tcall("mark", s, nonce)
                    drv.xfer(op, d, s)
                    row["bad_blocks"] = check_blocks(arrays, d, s, nonce)
                else:
                    mark_blocks(arrays, s, nonce)
                    drv.xfer(op, s, d)
                    row["bad_blocks"] = tcall("check", d, s, nonce)
                row["bytes"] = 2 * L * B * bb
                row["blocks"] = 2 * L * B
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            conn.send(("row", row))
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
    try:
        tcall("quit")
    except Exception:
        pass
    proc.join(10)
    conn.send(("done", rows))
    conn.close()
    os._exit(0)


def run_engine(engine, specs, scale=1.0, bar=None):
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_engine_initiator, args=(child, engine, specs, scale))
    proc.start()
    child.close()
    rows = []
    while True:
        if not conn.poll(600):
            rows.append({"id": f"{engine}/*", "engine": engine, "error": "engine run timed out"})
            break
        try:
            kind, val = conn.recv()
        except EOFError:
            rows.append({"id": f"{engine}/*", "engine": engine, "error": "engine process died"})
            break
        if kind == "row":
            rows.append(val)
            if bar:
                bar.step(val["id"])
        elif kind == "error":
            rows.append({"id": f"{engine}/*", "engine": engine, "error": val})
        elif kind == "done":
            break
    proc.join(30)
    if proc.is_alive():
        proc.kill()
    for r in rows:
        if r.get("median_s") and r.get("bytes"):
            r["GBps"] = r["bytes"] / r["median_s"] / 1e9
    return rows


def engine_specs(engine, selected_rows):
    """The peer-engine cases mirroring the selected kvblocks transfer rows."""
    paths = ("tcp",) if engine in ("mooncake", "nixl-tcp") else ("shm", "cma")
    want = []
    for r in selected_rows:
        parts = r["id"].split("/")
        if len(parts) == 4 and parts[0] in paths:
            key = tuple(parts[1:])
            if key not in want:
                want.append(key)
    return [(f"{engine}/{s}/{d}/{p}", s, d, p) for s, d, p in want]


def attach_vs(rows, peer_rows):
    by_key = {}
    for r in peer_rows:
        if r.get("median_s"):
            by_key[(r["engine"], r["size"], r["dir"], r["pattern"])] = r
    for r in rows:
        parts = r["id"].split("/")
        if len(parts) != 4 or parts[0] not in ("shm", "cma", "tcp") or not r.get("median_s"):
            continue
        engines = ("mooncake", "nixl-tcp") if parts[0] == "tcp" else ("nixl",)
        for e in engines:
            p = by_key.get((e, parts[1], parts[2], parts[3]))
            if p:
                r.setdefault("vs", {})[e] = r["median_s"] / p["median_s"]


# ----------------------------------------------------------------------------- targets
NIXL_SMALL_REF_S = 45e-6  # peers.md, used only when NIXL did not run


def targets(rows, peer_rows):
    by = {r["id"]: r for r in rows if r.get("median_s")}
    pe = {r["id"]: r for r in peer_rows if r.get("median_s")}
    out = []

    def add(name, value, goal, ok, detail):
        out.append({"target": name, "value": value, "goal": goal, "ok": ok, "detail": detail})

    for path in ("shm", "cma"):
        r = by.get(f"{path}/small/pull/random")
        if r:
            n = pe.get("nixl/small/pull/random")
            ref, src = (n["median_s"], "NIXL same run") if n else (NIXL_SMALL_REF_S, "NIXL 45 us from peers.md")
            v = r["median_s"] / ref
            add(f"{path} small pull random vs NIXL", f"{v:.3f}x", "<= 0.25x", v <= 0.25,
                f"{r['median_s'] * 1e6:.1f} us vs {ref * 1e6:.1f} us ({src})")
        for d in ("pull", "push"):
            r = by.get(f"{path}/large/{d}/random")
            if r and r.get("ratio"):
                v = 1 / r["ratio"]
                gb = r["bytes"] / _base_med(r, by) / 1e9
                add(f"{path} large {d} random vs numpy gather", f"{v:.2f}x bw", ">= 0.9x", v >= 0.9,
                    f"{r['GBps']:.2f} vs {gb:.2f} GB/s (interleaved)")
    for d in ("pull", "push"):
        r = by.get(f"tcp/large/{d}/random")
        if r and r.get("ratio"):
            v = 1 / r["ratio"]
            gb = r["bytes"] / _base_med(r, by) / 1e9
            add(f"tcp large {d} random vs raw socket", f"{v:.2f}x bw", ">= 0.8x", v >= 0.8,
                f"{r['GBps']:.2f} vs {gb:.2f} GB/s (interleaved)")
    a, b = by.get("tcp/large/pull/random"), by.get("tcp/large/push/random")
    if a and b and a.get("ratio") and b.get("ratio"):
        v = a["ratio"] / b["ratio"]  # each normalised by the raw socket measured beside it
        add("tcp large pull vs push time", f"{v:.2f}x", "within 10%", abs(v - 1) <= 0.10,
            f"{a['GBps']:.2f} vs {b['GBps']:.2f} GB/s; ratio of the two raw-socket-normalised times")
    r = by.get("tcp/small/pull/random")
    if r and r.get("ratio"):
        v = r["ratio"]
        add("tcp small pull random vs ping-pong RTT", f"{v:.2f}x", "<= 3x", v <= 3,
            f"{r['median_s'] * 1e6:.1f} us vs {_base_med(r, by) * 1e6:.1f} us (interleaved)")
    r = by.get("dispatch/pull-16x16B")
    if r:
        add("in-process dispatch, 16 blocks", f"{r['median_s'] * 1e6:.2f} us", "<= 1 us", r["median_s"] <= 1e-6,
            "validation + call, ndarray ids, 16-byte blocks")
    r = by.get("validation/ndarray/1048576")
    if r:
        v = r["median_s"] / r["blocks"] * 1e9
        add("validation at 1M blocks", f"{v:.2f} ns/block", "<= 2 ns/block", v <= 2, "numpy uint64 ids")
    r = by.get("import/kvblocks")
    if r:
        add("import kvblocks", f"{r['median_s'] * 1e3:.1f} ms", "<= 15 ms, no numpy",
            r["median_s"] <= 15e-3 and not r.get("bad_blocks"),
            "numpy imported!" if r.get("bad_blocks") else "numpy not imported")
    return out


def _base_med(r, by):
    return r.get("paired_baseline_median_s") or by[r["baseline"]]["median_s"]


# ----------------------------------------------------------------------------- output
def _fmt_t(s):
    if s is None:
        return "-"
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us" if s < 1e-5 else f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def table(rows, markdown=False):
    head = ["case", "bytes/call", "median", "p10-p90", "GB/s", "ns/block", "vs base", "vs peer", "check"]
    lines = []
    for r in rows:
        if r.get("error"):
            lines.append([r["id"], "", "ERROR", r["error"][:60], "", "", "", "", ""])
            continue
        vs = ", ".join(f"{k} {v:.2f}x" for k, v in sorted(r.get("vs", {}).items()))
        check = "" if "bad_blocks" not in r else ("ok" if r["bad_blocks"] == 0 else f"BAD {r['bad_blocks']}")
        if r["id"] == "import/kvblocks" and "bad_blocks" in r:
            check = "no numpy" if r["bad_blocks"] == 0 else "numpy imported"
        lines.append([
            r["id"],
            _hb(r["bytes"]) if r.get("bytes") else "-",
            _fmt_t(r.get("median_s")),
            f"{_fmt_t(r.get('p10_s'))} - {_fmt_t(r.get('p90_s'))}",
            f"{r['GBps']:.2f}" if r.get("GBps") else "-",
            f"{r['ns_per_block']:.1f}" if r.get("ns_per_block") and (r["group"] in ("validation", "scaling")
                                                                     if "group" in r else False) else "-",
            f"{r['ratio']:.2f}x" if r.get("ratio") else ("base" if not r.get("baseline") else "-"),
            vs or "-",
            check,
        ])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(x.replace("|", "/") for x in ln) + " |" for ln in lines]
        return "\n".join(out)
    widths = [max(len(head[i]), *(len(ln[i]) for ln in lines)) if lines else len(head[i]) for i in range(len(head))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*ln) for ln in lines])


def targets_table(tg, markdown=False):
    head = ["target", "measured", "goal", "holds", "detail"]
    lines = [[t["target"], t["value"], t["goal"], "yes" if t["ok"] else "NO", t["detail"]] for t in tg]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|---|---|---|---|---|"] +
                         ["| " + " | ".join(ln) + " |" for ln in lines])
    widths = [max(len(head[i]), *(len(ln[i]) for ln in lines)) if lines else len(head[i]) for i in range(len(head))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*ln) for ln in lines])


def machine():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    import kvblocks

    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu": cpu, "cores": os.cpu_count(), "memory": mem,
            "kernel": platform.release(), "python": platform.python_version(),
            "kvblocks": getattr(kvblocks, "__version__", "?"), "load_avg": os.getloadavg()}


def plot(rows, peer_rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib, which is not installed: pip install matplotlib", file=sys.stderr)
        return False
    series = {}
    for r in rows:
        if r.get("GBps") and r["id"].startswith("scaling/bytes/"):
            series.setdefault(f"kvblocks {r['path']} pull (64 random blocks)", []).append((r["bytes"], r["GBps"]))
        elif r.get("GBps") and r["id"].startswith("base/memcpy/"):
            series.setdefault("numpy memcpy", []).append((r["bytes"], r["GBps"]))
        elif r.get("GBps") and len(r["id"].split("/")) == 4 and r["id"].split("/")[0] in ("shm", "cma", "tcp") \
                and r["id"].endswith("pull/random"):
            series.setdefault(f"kvblocks {r['path']} pull (small/large cases)", []).append((r["bytes"], r["GBps"]))
        elif r.get("GBps") and r["id"].startswith("tcp/raw-send/"):
            series.setdefault("raw socket send", []).append((r["bytes"], r["GBps"]))
    for r in peer_rows:
        if r.get("GBps") and r.get("dir") == "pull" and r.get("pattern") == "random":
            series.setdefault(f"{r['engine']} pull", []).append((r["bytes"], r["GBps"]))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, pts in sorted(series.items()):
        pts.sort()
        cases_only = "small/large" in name or r"pull" in name and not name.startswith("kvblocks")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="x" if cases_only else "o",
                linestyle=":" if cases_only else "-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per call")
    ax.set_ylabel("GB/s (median)")
    ax.set_title("kvblocks: bandwidth vs transfer size per path")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


# ----------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvblocks bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--case", action="append", default=[], metavar="GROUP|GLOB",
                    help="run only these groups or case-id globs (repeatable); baselines are added")
    ap.add_argument("--list", action="store_true", help="list case ids and exit")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON")
    ap.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    ap.add_argument("--plot", metavar="FILE.png", help="bandwidth vs bytes per call (needs matplotlib)")
    ap.add_argument("--vs", action="append", default=[], choices=["nixl", "mooncake"],
                    help="also run the same-host / TCP cases through this engine (repeatable)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--no-pairing", action="store_true",
                    help="measure baselines only once instead of interleaved with each case")
    ap.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    args = ap.parse_args(argv)
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("the benchmarks need numpy: pip install 'kvblocks[bench]'", file=sys.stderr)
        return 2
    cases = all_cases()
    if args.list:
        for c in cases:
            print(f"{c.group:<11} {c.id}" + (f"   (baseline {c.baseline})" if c.baseline else ""))
        return 0
    chosen = select(cases, args.case)
    scale = 0.3 if args.quick else 1.0
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--plot needs matplotlib, which is not installed: pip install matplotlib "
                  "(continuing without the plot)", file=sys.stderr)
            args.plot = None
    h = Harness()
    try:
        rows = run_cases(chosen, h, scale, not args.no_progress, not args.no_pairing)
    finally:
        h.close()
    peer_rows = []
    skipped = []
    for e in args.vs:
        for variant in (("nixl", "nixl-tcp") if e == "nixl" else ("mooncake",)):
            specs = engine_specs(variant, rows)
            if not specs:
                which = "tcp" if variant in ("mooncake", "nixl-tcp") else "shm/cma"
                skipped.append(f"{variant}: no {which} transfer case selected; nothing to compare")
                continue
            ok, why = engine_available(variant)
            if not ok:
                skipped.append(f"{variant}: not available ({why}); skipped")
                continue
            bar = Progress(len(specs), not args.no_progress)
            peer_rows += run_engine(variant, specs, scale, bar)
            bar.done()
    attach_vs(rows, peer_rows)
    tg = targets(rows, peer_rows)
    meta = machine()
    print(f"kvblocks {meta['kvblocks']} bench  {meta['date']}  {meta['cores']} cores  {meta['cpu']}")
    print("median/p10-p90 per call; 'vs base' = median time / median time of the baseline measured "
          "interleaved with it (< 1 is faster); "
          "'vs peer' = kvblocks time / peer engine time\n")
    print(table(rows))
    if peer_rows:
        print("\npeer engines (same cases, same run)\n")
        print(table(peer_rows))
    for s in skipped:
        print(s)
    if tg:
        print("\ntargets\n")
        print(targets_table(tg))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "argv": sys.argv, "results": rows, "peers": peer_rows, "targets": tg,
                       "skipped": skipped}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, peer_rows, tg, skipped))
    if args.plot and plot(rows, peer_rows, args.plot):
        print(f"\nplot written to {args.plot}")
    bad = [r["id"] for r in rows + peer_rows if r.get("bad_blocks") and not r["id"].startswith("import/")]
    if bad:
        print(f"\nCORRUPT DATA in {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
