# SPDX-License-Identifier: Apache-2.0
"""The peer process and the cache pairs the transfer cases move blocks between.

The peer is a real second process (multiprocessing spawn) holding its own LlmDataDist, driven
over a Pipe; one per transport, shared by all cases of a run (CLI or pytest session).
"""
from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import socket
import threading

from .common import DISPATCH_SHAPES, KIND, UCX_TLS, MiB, TRANSPORT
from .common import np as _np
from .baselines import raw_server
from .markers import check_blocks, mark_blocks


def free_port():
    """A loopback TCP port that was free a moment ago.

    Raises:
        OSError: no socket could be bound.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_cache(dd, kind, num_tensors, num_blocks, block_bytes):
    """``(cache, arrays)``: ``alloc`` = runtime-allocated, ``reg`` = registered numpy arrays.

    Raises:
        kvblocks.LLMException: the runtime refused the allocation or registration.
    """
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


def free_cache(dd, kind, cache):
    """Releases a cache from :func:`make_cache`.

    Raises:
        kvblocks.LLMException: the runtime does not know the cache.
    """
    if kind == "alloc":
        dd.deallocate_cache(cache)
    else:
        dd.unregister_kv_cache(cache)


@contextlib.contextmanager
def _ucx_env(transport):
    """UCX_TLS set to the bench's set while a ucx engine and its peer start. Raises nothing."""
    if transport != "ucx":
        yield
        return
    old = {k: os.environ.get(k) for k in ("UCX_TLS", "UCX_WARN_UNUSED_ENV_VARS")}
    os.environ.update({"UCX_TLS": UCX_TLS, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ----------------------------------------------------------------------------- peer process
def _trusted(transport):
    """The bench runs on loopback, which only this host reaches: UCX's opt-in (README, threat model)."""
    import kvblocks as kb

    return {kb.OPTION_UCX_TRUSTED_NETWORK: "1"} if transport == "ucx" else {}


def _engine_options(transport):
    """Engine options for a bench transport: ``tls`` is Transport=tcp with kvblocks.Encryption=tls."""
    import kvblocks as kb

    if transport == "tls":
        return {kb.OPTION_TRANSPORT: "tcp", "kvblocks.Encryption": "tls", kb.OPTION_AUTH_TOKEN: "kvblocks-bench"}
    return {kb.OPTION_TRANSPORT: transport, **_trusted(transport)}


def _listening_datadist(cluster_id, transport):
    import kvblocks as kb

    dd = kb.LlmDataDist(cluster_id, kb.LlmRole.MIX)
    for _ in range(20):
        port = free_port()
        try:
            dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}",
                           kb.OPTION_SYNC_CACHE_WAIT_TIME: "60000", **_engine_options(transport)})
            return dd, port
        except Exception:  # port raced away: try another
            continue
    raise RuntimeError("benchmark peer: no free loopback port after 20 tries")


class _PeerState:
    """The peer's caches and raw socket, one method per Pipe op."""

    def __init__(self, dd):
        self.dd, self.caches, self.lsock = dd, {}, None

    def alloc(self, key, kind, nt, nb, bb):
        c, arrays = make_cache(self.dd, kind, nt, nb, bb)
        self.caches[key] = (kind, c, arrays)
        return c.cache_id

    def free(self, key):
        kind, c, arrays = self.caches.pop(key)
        del arrays
        free_cache(self.dd, kind, c)

    def mark(self, key, ids, nonce):
        mark_blocks(self.caches[key][2], ids, nonce)

    def check(self, key, dst, src, nonce):
        return check_blocks(self.caches[key][2], dst, src, nonce)

    def addrs(self, key):
        return os.getpid(), [a.ctypes.data for a in self.caches[key][2]]

    def raw(self):
        if self.lsock is None:
            self.lsock = socket.socket()
            self.lsock.bind(("127.0.0.1", 0))
            self.lsock.listen(8)
            threading.Thread(target=raw_server, args=(self.lsock,), daemon=True).start()
        return self.lsock.getsockname()[1]

    def quit(self):
        return None


_PEER_OPS = ("alloc", "free", "mark", "check", "addrs", "raw", "quit")


def _peer_main(conn, cluster_id, transport):
    """The remote side: its own LlmDataDist (MIX) listening on loopback, driven over a Pipe."""
    try:
        dd, port = _listening_datadist(cluster_id, transport)
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", port))
    state = _PeerState(dd)
    while True:
        try:
            op, *args = conn.recv()
        except EOFError:
            break
        try:
            if op not in _PEER_OPS:
                raise ValueError(f"unknown op {op!r}")
            conn.send(("ok", getattr(state, op)(*args)))
        except Exception as e:  # report, keep serving
            conn.send(("error", f"{type(e).__name__}: {e}"))
        if op == "quit":
            break
    state.caches.clear()
    dd.finalize()


class Peer:
    """A running peer process and its Pipe."""

    def __init__(self, ctx, cluster_id, transport):
        """Starts the peer and waits for its listening port.

        Raises:
            RuntimeError: the peer failed to start or did not answer.
        """
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_peer_main, args=(child, cluster_id, transport), daemon=True)
        self.proc.start()
        child.close()
        self.cluster_id = cluster_id
        self.port = self.call()

    def call(self, *msg, timeout=300):
        """Sends ``msg`` (an op and its arguments) and returns the peer's answer.

        Raises:
            RuntimeError: the peer reported an error or did not answer within ``timeout`` s.
        """
        if msg:
            self.conn.send(msg)
        if not self.conn.poll(timeout):
            raise RuntimeError(f"benchmark peer did not answer {msg[:1]} within {timeout}s")
        st, val = self.conn.recv()
        if st != "ok":
            raise RuntimeError(f"benchmark peer: {val}")
        return val

    def close(self):
        """Asks the peer to quit, then kills it if it lingers. Raises nothing."""
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
        """Allocates both caches of ``nt`` tensors of ``nb`` blocks of ``bb`` bytes and relinks.

        Raises:
            RuntimeError: the peer failed or the relink failed.
            kvblocks.LLMException: the local allocation failed.
        """
        import kvblocks as kb

        self.h, self.path, self.key = h, path, (path, nt, nb, bb)
        self.kind = KIND[path]
        self.nt, self.nb, self.bb = nt, nb, bb
        self.dd, self.peer = h.link(TRANSPORT[path])
        self.rkey = "%s-%d-%d-%d" % self.key
        rid = self.peer.call("alloc", self.rkey, self.kind, nt, nb, bb)
        h.relink(TRANSPORT[path])
        self.index = kb.CacheIndex(self.peer.cluster_id, rid)
        self.cache, self.arrays = make_cache(self.dd, self.kind, nt, nb, bb)
        self.bytes = nt * nb * bb

    def free(self):
        """Frees both caches.

        Raises:
            RuntimeError: the peer failed to free its side.
            kvblocks.LLMException: the local free failed.
        """
        self.arrays = None
        free_cache(self.dd, self.kind, self.cache)
        self.peer.call("free", self.rkey)


def _cluster_info(peer):
    import kvblocks as kb

    return [kb.ClusterInfo(peer.cluster_id, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", peer.port)])]


def _linked_inprocess():
    """Two LlmDataDists in this process with caches of every DISPATCH_SHAPE, b linked to a."""
    import kvblocks as kb

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
    return a, b, caches


class Harness:
    """Peer processes, local LlmDataDists and cache pairs shared by the cases (CLI and pytest)."""

    # bytes of cache pairs kept per side before older ones are freed: two large pairs (1 GiB each; cma
    # is timed beside shm) and the small ones
    MAX_HELD = 2304 * MiB

    def __init__(self):
        """Starts nothing yet; peers start on first use. Raises nothing."""
        self.ctx = mp.get_context("spawn")
        self.peers = {}
        self.locals = {}
        self.pairs = {}
        self.inproc = None
        self.sockets = []  # raw baseline connections, closed with the harness
        self.load = []  # busy-loop processes of the loaded cases (cpu_load)
        self.cpus = os.sched_getaffinity(0)  # given back after the one-cpu cases
        self._next_id = itertools.count(1)
        self.nonce = itertools.count(1)

    def link(self, transport):
        """``(local LlmDataDist, Peer)`` for ``transport``, started and linked on first use.

        Raises:
            RuntimeError: the peer failed to start or the link failed.
            kvblocks.LLMException: the local LlmDataDist failed to initialize.
        """
        import kvblocks as kb

        if transport not in self.peers:
            base, _, integrity = transport.partition("+")  # "tcp+crc32c": kvblocks.Integrity here
            extra = {kb.OPTION_INTEGRITY: integrity} if integrity else {}
            with _ucx_env(base):  # both processes' UCP contexts read UCX_TLS when made
                peer = Peer(self.ctx, 2000 + next(self._next_id), base)
                dd = kb.LlmDataDist(1000 + next(self._next_id), kb.LlmRole.MIX)
                dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "60000",
                               **_engine_options(base), **extra})
            self.peers[transport] = peer
            self.locals[transport] = dd
            self.relink(transport, first=True)
        return self.locals[transport], self.peers[transport]

    def relink(self, transport, first=False):
        """(Re)links to the peer. The runtime learns the peer's caches at link time, so a link is
        made again after the peer allocated a cache.

        Raises:
            RuntimeError: the link failed.
        """
        import kvblocks as kb

        dd, peer = self.locals[transport], self.peers[transport]
        ci = _cluster_info(peer)
        if not first:
            dd.unlink_llm_clusters(ci, 10000)
        rets = dd.link_llm_clusters(ci, 10000)
        if rets != [kb.Status.LLM_SUCCESS]:
            raise RuntimeError(f"link to the benchmark peer failed: {rets}")

    def link_path(self, transport):
        """The data path the runtime chose to the peer (``shm``, ``cma``, ``tcp``).

        Raises:
            RuntimeError: as :meth:`link`.
        """
        dd, peer = self.link(transport)
        return dd.link_path(peer.cluster_id)

    def pair(self, path, nt, nb, bb):
        """The cache pair for ``path`` and shape, made (and older pairs freed) as needed.

        Raises:
            RuntimeError, kvblocks.LLMException: as :class:`Pair`.
        """
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
        """Port of the tcp peer's raw socket server (the socket baselines).

        Raises:
            RuntimeError: as :meth:`link`.
        """
        _, peer = self.link("tcp")
        return peer.call("raw")

    def inprocess(self):
        """``(a, b, caches)``: two LlmDataDists in this process, linked (path "inprocess").

        Raises:
            RuntimeError: the in-process link failed.
        """
        if self.inproc is None:
            self.inproc = _linked_inprocess()
        return self.inproc

    def cpu_load(self, on):
        """Starts (``on``) or stops an unrelated CPU load: one busy-looping process pinned to each
        CPU this process started with, at normal priority, so every core is busy while a loaded case
        runs. Pinned: a child inherits its parent's affinity, so after ``one_cpu`` every loop would
        share that one CPU and leave the other idle. Idempotent.

        Raises:
            OSError: a load process cannot be started or pinned.
        """
        import subprocess
        import sys
        if on and not self.load:
            for cpu in sorted(self.cpus):
                p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                self.load.append(p)
                os.sched_setaffinity(p.pid, {cpu})
        elif not on:
            for p in self.load:
                p.kill()
                p.wait()
            self.load = []

    def one_cpu(self, on):
        """Pins (``on``) every thread of this process and of the peer processes to this process's
        first CPU, or gives them back every CPU this process started with. Idempotent.

        Raises:
            OSError: the affinity of a live thread cannot be set.
        """
        cpus = {min(self.cpus)} if on else self.cpus
        self._place(cpus, cpus)

    def two_cpus(self, on):
        """Pins (``on``) every thread of this process to its first CPU and every thread of the peer
        processes to its last, or gives them all back every CPU this process started with.
        Idempotent; with one CPU, both ends share it.

        Raises:
            OSError: the affinity of a live thread cannot be set.
        """
        mine, theirs = ({min(self.cpus)}, {max(self.cpus)}) if on else (self.cpus, self.cpus)
        self._place(mine, theirs)

    def _place(self, mine, theirs):
        """Sets the affinity of every thread of this process to ``mine``, of the peers' to ``theirs``."""
        for pid, cpus in [(os.getpid(), mine)] + [(p.proc.pid, theirs) for p in self.peers.values()]:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    os.sched_setaffinity(int(tid), cpus)
                except ProcessLookupError:  # the thread ended meanwhile
                    pass

    def close(self):
        """Frees every pair and stops every peer; best effort. Raises nothing."""
        self.cpu_load(False)
        for p in list(self.pairs.values()):
            try:
                p.free()
            except Exception:
                pass
        self.pairs.clear()
        for s in self.sockets:
            s.close()
        self.sockets.clear()
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
