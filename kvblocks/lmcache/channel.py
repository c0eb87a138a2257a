# SPDX-License-Identifier: Apache-2.0
"""kvblocks as an LMCache multi-process P2P transfer channel (LMCache 0.5.6,
``lmcache.v1.distributed.transfer_channel``).

One kvblocks engine per LMCache server. Its L1 arena (one host-memory region) is registered once as a
kvblocks cache of ``align_bytes`` blocks under a fixed key, so an LMCache address ``(offset, size)`` is
the block range ``[offset / align, ceil((offset + size) / align))``. The engine listens on the
channel's ``listen_url`` and its cluster id is derived from the ``advertise_url``: a client that knows a
peer's advertised url knows its listener and cluster id, and finds its arena by key in the table the
link brought (``kvblocks.integrations.peers``), with no hand-shake of our own. Links prove
``kvblocks.AuthToken`` (and, with tokens on both sides, the listener's cluster id). The data path is
shared memory / CMA between two servers on one host and TCP otherwise (``kvblocks.Transport=auto``).

Reads are kvblocks pulls, one per object, submitted together (``pull_kv_blocks_batch``) and completed
by the runtime's async handles (``kvblocks.integrations.completion``): no Python thread waits. Every
read has the engine's deadline (``timeout_ms``, ``llm.SyncKvCacheWaitTime``), which the launcher sets
below LMCache's ``--p2p-load-timeout``: a frozen or dead peer's read is finished (all objects failed)
before LMCache gives up on it, and once a handle is finished no byte of its destination changes.

Trust: the remote addresses come from the peer's lookup answer. Each object is checked here (aligned,
inside our arena, inside the arena the peer's link announced, same size on both sides) and refused on
its own (its flag is False) when it is not; the peer's runtime checks its side again.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import kvblocks as kb
from kvblocks.integrations.completion import Transfers
from kvblocks.integrations.peers import Peer, Peers, cache_key_of, check_id, cluster_id_of
from lmcache.v1.distributed.transfer_channel.abstract import (
    TransferChannelClient,
    TransferChannelContext,
    TransferChannelServer,
)
from lmcache.v1.distributed.transfer_channel.api import TransferChannelAddress, TransferChannelReadResult

logger = logging.getLogger("kvblocks.lmcache")

__all__ = ["KvblocksChannelContext", "KvblocksChannelClient", "KvblocksChannelServer", "create_context",
           "engine_id_of", "ARENA_KEY"]

ARENA_KEY = cache_key_of("lmcache-l1-arena")
_ONE_TENSOR = kb.KvCacheExtParam(src_layer_range=(-1, -1), dst_layer_range=(-1, -1), tensor_num_per_layer=1)
# After a failed link attempt reads to that peer fail at once for 1 s, doubling with each further failed
# attempt up to 30 s: a relink blocks the caller (LMCache's prefetch loop) up to link_timeout_ms.
_RELINK_BACKOFF_S, _RELINK_BACKOFF_MAX_S = 1.0, 30.0
# A caller that asks about the same read again within _SPIN_GAP_S of our last answer is spinning (LMCache's
# transfer_channel_benchmark does): it then waits, GIL released, until the read finishes or _SPIN_WAIT_S pass,
# instead of taking a core from the runtime's copy threads. A caller polling on a timer (LMCache's P2P
# adapter, on its periodic notifier) never waits.
_SPIN_GAP_S, _SPIN_WAIT_S = 100e-6, 1e-3


def parse_url(url: str) -> Tuple[str, int]:
    """``(host, port)`` of ``host:port`` (or ``tcp://host:port``); ValueError names the url otherwise."""
    if not isinstance(url, str):
        raise ValueError(f"transfer channel url must be a str, got {type(url).__name__}")
    host, _, port = url.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid transfer channel url {url!r} (expected host:port)")
    return host, int(port)


def engine_id_of(advertise_url: str) -> str:
    """The kvblocks engine id of the LMCache server advertising ``advertise_url`` (its cluster id is
    derived from it: both sides agree without asking). Raises ValueError for a bad url."""
    host, port = parse_url(advertise_url)
    return check_id(f"lmcache-p2p:{host}:{port}")


def _ipv4(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise ConnectionError(f"cannot resolve {host!r}: {e}") from None


@dataclass
class _Task:
    """One submit_read: per object, None (refused) or in flight / finished in ``results``."""

    n: int
    submitted: List[int]  # object indices handed to the runtime
    t0: float
    results: Dict[int, bool] = field(default_factory=dict)  # object index -> succeeded
    handles: List[Any] = field(default_factory=list)  # the runtime's, in submission order
    answered: float = 0.0  # perf_counter() of our last "not finished" answer

    def finished(self) -> bool:
        return len(self.results) == len(self.submitted)


class KvblocksChannelServer(TransferChannelServer):
    """The engine's listener (bound when the context is created); close() is the context's."""

    def __init__(self, listen_url: str, advertise_url: str, l1_memory_desc: Any,
                 context: "Optional[KvblocksChannelContext]" = None) -> None:
        self.listen_url = listen_url
        self.advertise_url = advertise_url
        self._l1 = l1_memory_desc
        self._ctx = context

    @property
    def listen_address(self) -> Optional[str]:
        return None if self._ctx is None else self._ctx.listen_address

    def close(self) -> None:
        """Nothing of its own: the listener goes with the context's engine."""


class KvblocksChannelClient(TransferChannelClient):
    """Reads from one peer's arena into ours. Thread-safe."""

    def __init__(self, context: "KvblocksChannelContext", peer: Peer, url: str) -> None:
        self._ctx = context
        self._peer = peer
        self.url = url
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._tasks: Dict[int, _Task] = {}
        self._transfers: Transfers[int] = Transfers()
        self._retry_at = 0.0
        self._link_fails = 0
        self._closed = False

    @property
    def peer(self) -> Peer:
        return self._peer

    # ------------------------------------------------------------------ reads

    def submit_read(self, local_addresses: List[TransferChannelAddress],
                    remote_addresses: List[TransferChannelAddress]) -> int:
        """Starts reading each remote object into the local one; returns a task id for
        :meth:`query_read_status`. Never waits for data; when the peer's link broke it links again first
        (at most ``link_timeout_ms``, then not again during a back-off of 1 s doubling to 30 s). An
        object that fails a check, or every object when the peer cannot be reached, is finished at once
        with its flag False.

        Raises ValueError when the two lists differ in length (a caller bug, as in NIXL's channel)."""
        if len(local_addresses) != len(remote_addresses):
            raise ValueError(f"local_addresses and remote_addresses must have equal length "
                             f"({len(local_addresses)} != {len(remote_addresses)})")
        n = len(local_addresses)
        with self._lock:
            self._sweep()
            tid = next(self._ids)
            task = self._tasks[tid] = _Task(n, [], time.perf_counter())
            if self._closed or n == 0:
                return tid
            remote = self._remote_arena()
            if remote is None:
                return tid
            cache_id, remote_blocks = remote
            reqs, idx = self._requests(local_addresses, remote_addresses, cache_id, remote_blocks)
            if not reqs:
                return tid
            try:
                handles = self._ctx.dd.pull_kv_blocks_batch(reqs)
            except kb.LLMException as e:
                self._failed(e)
                return tid
            task.submitted, task.handles = idx, handles
            for i, h in zip(idx, handles):
                self._transfers.add((tid, i), h, tid, task.t0)
            return tid

    def _remote_arena(self) -> Optional[Tuple[int, int]]:
        """(cache id, block count) of the peer's arena on an up link, linking again if it broke;
        None when the peer cannot be reached now (the read fails at once)."""
        p = self._peer
        if not self._ctx.peers.is_up(p):
            if time.monotonic() < self._retry_at:
                return None
            try:
                self._ctx.peers.ensure_linked(p)
            except ConnectionError as e:
                self._link_fails += 1
                backoff = min(_RELINK_BACKOFF_MAX_S, _RELINK_BACKOFF_S * 2 ** (self._link_fails - 1))
                self._retry_at = time.monotonic() + backoff
                logger.warning("kvblocks channel: %s (next attempt in %.0f s)", e, backoff)
                return None
            self._link_fails = 0
        try:
            cid = self._ctx.peers.find_cache(p, ARENA_KEY)
            blocks = int(self._ctx.peers.describe_cache(p, cid)["num_blocks"])
        except kb.LLMException as e:
            self._failed(e)
            return None
        return cid, blocks

    def _requests(self, local: List[TransferChannelAddress], remote: List[TransferChannelAddress],
                  cache_id: int, remote_blocks: int) -> Tuple[List[tuple], List[int]]:
        """The pull of each object that passes the checks, and the objects' indices."""
        ctx = self._ctx
        align, index = ctx.align, kb.CacheIndex(self._peer.cluster_id, cache_id)
        reqs, idx = [], []
        for i, (lo, ro) in enumerate(zip(local, remote)):
            dst = ctx.blocks_of(lo, ctx.num_blocks)
            src = ctx.blocks_of(ro, remote_blocks)
            if dst is None or src is None or lo.size != ro.size:
                logger.warning("kvblocks channel: object %d refused (local %r, remote %r, arena of %d/%d "
                               "blocks of %d bytes)", i, lo, ro, ctx.num_blocks, remote_blocks, align)
                continue
            reqs.append((index, ctx.cache, np.arange(src[0], src[1], dtype=np.int64),
                         np.arange(dst[0], dst[1], dtype=np.int64), _ONE_TENSOR))
            idx.append(i)
        return reqs, idx

    def _failed(self, e: BaseException) -> None:
        if isinstance(e, (kb.LinkError, kb.LLMTimeoutError)):
            self._ctx.peers.mark_broken(self._peer)
        logger.warning("kvblocks channel: read from %s failed: %s", self.url, e)

    def query_read_status(self, task_id: int) -> TransferChannelReadResult:
        """Whether the read finished and, once it has, one success flag per object. A finished task is
        forgotten (as NIXL's channel does): asking again raises KeyError, as for an unknown id.
        Returns at once, except to a caller that asks again within 100 us of our last answer (a spinning
        caller): that call waits up to 1 ms (GIL released) for the read to finish."""
        task, finished = self._poll(task_id)
        if not finished and time.perf_counter() - task.answered < _SPIN_GAP_S:
            _wait_some(task.handles, _SPIN_WAIT_S)
            task, finished = self._poll(task_id)
        if not finished:
            task.answered = time.perf_counter()
            return TransferChannelReadResult(finished=False, succeeded_mask=[])
        mask = [False] * task.n  # the task is ours alone now
        for i, ok in task.results.items():
            mask[i] = ok
        if not all(mask):
            logger.warning("kvblocks channel: read %d from %s: %d of %d objects failed (answered %.3f s after "
                           "submission)", task_id, self.url, mask.count(False), task.n, time.perf_counter() - task.t0)
        return TransferChannelReadResult(finished=True, succeeded_mask=mask)

    def _poll(self, task_id: int) -> Tuple[_Task, bool]:
        """The task and whether it finished (then it is forgotten). KeyError for an unknown id."""
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise KeyError(f"Unknown read task id: {task_id}")
            self._collect()
            finished = task.finished()
            if finished:
                del self._tasks[task_id]
            return task, finished

    def _collect(self) -> None:
        for f in self._transfers.poll():
            t = self._tasks.get(f.context)
            if t is not None:
                t.results[f.key[1]] = f.ok
            if not f.ok:
                logger.warning("kvblocks channel: object %d of read %d from %s failed after %.3f s: %s",
                               f.key[1], f.context, self.url, f.seconds, f.error)
                if f.error and ("Timeout" in f.error or "Link" in f.error or "NOT_YET_LINK" in f.error):
                    self._ctx.peers.mark_broken(self._peer)

    def _sweep(self) -> None:
        """Forgets finished tasks nobody asked about for long (LMCache drops a task past its load timeout
        without asking again): their memory is no longer the runtime's."""
        horizon = time.perf_counter() - 2 * self._ctx.timeout_s - 60
        if self._tasks and next(iter(self._tasks.values())).t0 < horizon:
            self._collect()
            for tid in [k for k, t in self._tasks.items() if t.t0 < horizon and t.finished()]:
                del self._tasks[tid]

    @property
    def in_flight(self) -> int:
        return len(self._transfers)

    def close(self, timeout: Optional[float] = None) -> None:
        """Refuses new reads and waits (GIL released) until the runtime is done with every read in
        flight, at most until their deadline: afterwards no byte of them lands."""
        with self._lock:
            self._closed = True
            self._transfers.wait_all(self._ctx.timeout_s + 1 if timeout is None else timeout)
            self._tasks.clear()


class KvblocksChannelContext(TransferChannelContext):
    """One kvblocks engine, its registered L1 arena, and a client per peer (LMCache's singleton).

    Args (also the factory's keyword arguments):
        l1_memory_desc: LMCache's ``L1MemoryDesc`` (ptr, size, align_bytes) of the arena.
        listen_url: ``host:port`` the engine listens on (links from peers come here).
        advertise_url: ``host:port`` peers reach us at; our cluster id is derived from it.
        auth_token: the secret every link proves (``kvblocks.AuthToken``); default ``KVBLOCKS_AUTH_TOKEN``.
            Required: without it anyone who reaches the port could read and write the arena.
        transport: ``kvblocks.Transport``: ``auto`` (shm/CMA on one host, TCP across hosts), ``shm``, ``tcp``.
        timeout_ms: deadline of one read (keep it below LMCache's ``--p2p-load-timeout``).
        link_timeout_ms: bound of one link attempt (first use of a peer, relink after a failure).
        options: more kvblocks engine options, e.g. ``{"kvblocks.Encryption": "tls"}``.
        **_ignored: other channels' keyword arguments (the benchmark passes NIXL's ``backends``).
    Raises ValueError for a missing token or a bad url or arena; kb.LLMException when the engine does
    not start (the port is taken, say).
    """

    def __init__(self, l1_memory_desc: Any, listen_url: str, advertise_url: str, *,
                 auth_token: Optional[str] = None, transport: str = "auto", timeout_ms: int = 5000,
                 link_timeout_ms: int = 2000, options: Optional[Dict[str, str]] = None, **_ignored: Any) -> None:
        token = auth_token or os.environ.get("KVBLOCKS_AUTH_TOKEN")
        if not token:
            raise ValueError("the kvblocks transfer channel needs auth_token (or KVBLOCKS_AUTH_TOKEN): without "
                             "it anyone who reaches the listen port could read and write the L1 arena")
        self.align = int(l1_memory_desc.align_bytes)
        self.size = int(l1_memory_desc.size)
        if self.align <= 0 or self.size < self.align or not l1_memory_desc.ptr:
            raise ValueError(f"L1 arena ptr={l1_memory_desc.ptr:#x} size={self.size} align={self.align} is not "
                             "usable")
        self.num_blocks = self.size // self.align
        self.timeout_s = int(timeout_ms) / 1000.0
        lhost, lport = parse_url(listen_url)
        self.advertise_url = advertise_url
        self.engine_id = engine_id_of(advertise_url)
        self.dd: Any = kb.LlmDataDist(cluster_id_of(self.engine_id), kb.LlmRole.MIX)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport,
                            kb.OPTION_SYNC_CACHE_WAIT_TIME: str(int(timeout_ms)), **(options or {}),
                            kb.OPTION_LISTEN_IP_INFO: f"{_ipv4(lhost)}:{lport}", kb.OPTION_AUTH_TOKEN: token})
        try:
            desc = kb.CacheDesc(1, kb.DataType.DT_UINT8, [self.num_blocks, self.align], kb.CachePlacement.HOST)
            self.cache = self.dd._add_cache(desc, [int(l1_memory_desc.ptr)], 0, ARENA_KEY, l1_memory_desc)
        except Exception:
            self.dd.finalize()
            raise
        self.peers = Peers(self.dd, link_timeout_ms=int(link_timeout_ms))
        self._lock = threading.Lock()
        self._clients: Dict[str, KvblocksChannelClient] = {}
        self._server = KvblocksChannelServer(listen_url, advertise_url, l1_memory_desc, self)

    @property
    def listen_address(self) -> Optional[str]:
        return None if self.dd is None else self.dd.listen_address

    def blocks_of(self, a: Any, num_blocks: int) -> Optional[Tuple[int, int]]:
        """``[first, end)`` blocks of address ``a`` in an arena of ``num_blocks`` blocks; None when ``a``
        is not an aligned, non-empty range inside it."""
        off, size = getattr(a, "offset", None), getattr(a, "size", None)
        if type(off) is not int or type(size) is not int or off < 0 or size <= 0 or off % self.align:
            return None
        first, end = off // self.align, -(-(off + size) // self.align)
        return (first, end) if end <= num_blocks else None

    # ------------------------------------------------------------------ LMCache's interface

    def get_transfer_channel_server(self) -> KvblocksChannelServer:
        return self._server

    def get_transfer_channel_client(self, peer_advertise_url: str) -> KvblocksChannelClient:
        """The client of the peer advertising ``peer_advertise_url``, linked (made on first use).
        Raises ValueError for a bad url or our own; ConnectionError when the link fails (LMCache's P2P
        controller then tries the peer again on its next cycle)."""
        with self._lock:
            c = self._clients.get(peer_advertise_url)
            if c is not None:
                return c
        if engine_id_of(peer_advertise_url) == self.engine_id:
            raise ValueError(f"{peer_advertise_url!r} is this server's own advertise url")
        host, port = parse_url(peer_advertise_url)
        peer = self.peers.get(engine_id_of(peer_advertise_url), _ipv4(host), port)
        self.peers.ensure_linked(peer)
        with self._lock:
            return self._clients.setdefault(peer_advertise_url, KvblocksChannelClient(self, peer, peer_advertise_url))

    def remove_transfer_channel_client(self, peer_advertise_url: str) -> None:
        """Closes the peer's client (waiting out its reads) and drops the link. Unknown peers: nothing."""
        with self._lock:
            c = self._clients.pop(peer_advertise_url, None)
        if c is None:
            return
        c.close()
        self._unlink(c.peer)

    def _unlink(self, p: Peer) -> None:
        try:
            self.dd.unlink_llm_clusters([p.cluster_info()], timeout_in_millis=self.peers.link_timeout_ms,
                                        force=True)
        except kb.LLMException:
            pass
        p.linked = False
        p.caches.clear()

    def get_transfer_channel_address(self, lmcache_addresses: List[Tuple[int, int]]) -> List[TransferChannelAddress]:
        """Our ``(offset, size)`` objects as channel addresses. Raises ValueError for one outside the
        arena, unaligned or empty (they come from our own allocator: a bad one is a bug)."""
        out = []
        for offset, size in lmcache_addresses:
            a = TransferChannelAddress(offset=int(offset), size=int(size))
            if self.blocks_of(a, self.num_blocks) is None:
                raise ValueError(f"object [{int(offset):#x}, +{int(size):#x}) is not an aligned non-empty range "
                                 f"of the registered L1 arena [0x0, {self.size:#x}) (align {self.align})")
            out.append(a)
        return out

    def get_num_connected_clients(self) -> int:
        """Peers with a live link to or from this engine."""
        if self.dd is None:
            return 0
        return sum(1 for p in self.dd.metrics()["peers"] if p["peer"] is not None and p["linked"])

    def close(self) -> None:
        """Waits out reads in flight, unlinks every peer, unregisters the arena, stops the engine."""
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for c in clients:
            c.close()
        if self.dd is None:
            return
        self._server.close()
        self.peers.close()
        try:
            self.dd.unregister_kv_cache(self.cache)
        except kb.LLMException as e:
            logger.warning("kvblocks channel close: unregister failed: %s", e)
        self.dd.finalize()
        self.dd = None


def _wait_some(handles: List[Any], seconds: float) -> None:
    """Waits (GIL released) until every handle is done or ``seconds`` passed; errors are the poll's."""
    end = time.perf_counter() + seconds
    for h in handles:
        left = end - time.perf_counter()
        if left <= 0:
            return
        if not h.done():
            try:
                h.wait(left)
            except TimeoutError:
                return
            except kb.LLMException:
                pass


def create_context(l1_memory_desc: Any, listen_url: str, advertise_url: str, **kwargs: Any) -> KvblocksChannelContext:
    """LMCache's factory signature (see :class:`KvblocksChannelContext` for the keyword arguments)."""
    return KvblocksChannelContext(l1_memory_desc, listen_url, advertise_url, **kwargs)
