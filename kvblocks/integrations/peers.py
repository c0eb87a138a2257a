# SPDX-License-Identifier: Apache-2.0
"""Remote engines an integration talks to: one kvblocks link each, made once, made again when it broke.

An engine's kvblocks cluster id is derived from its engine id (:func:`cluster_id_of`), so both sides
agree on it without asking, and a remote cache is found by a key derived from a name
(:func:`cache_key_of`) in the table the peer sent at link time (``Peers.find_cache``): no hand-shake of
our own is needed before the first transfer.

A peer is its engine id *at* its address: params naming a known engine id with another address make
another :class:`Peer` (which must prove that cluster id itself when linking), never redirect the known one.
"""
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import kvblocks as kb

MAX_ID = 256  # engine ids (vLLM's are ~40 characters)


def cluster_id_of(engine_id: str) -> int:
    """The kvblocks cluster id of an engine: 56 bits of the engine id's SHA-256 (stable across processes,
    never 0)."""
    return int.from_bytes(hashlib.sha256(engine_id.encode()).digest()[:7], "big") or 1


def cache_key_of(name: str) -> int:
    """A cache key (``BlocksCacheKey``, a non-negative int64) for a cache registered under ``name``."""
    return int.from_bytes(hashlib.sha256(b"kvblocks-cache:" + name.encode()).digest()[:8], "big") >> 1


def check_id(engine_id: object) -> str:
    """``engine_id`` if it is a usable engine id (a str of 1..MAX_ID characters); ValueError otherwise."""
    if not isinstance(engine_id, str) or not 0 < len(engine_id) <= MAX_ID:
        raise ValueError(f"engine id must be a str of 1..{MAX_ID} characters, got {str(engine_id)[:64]!r}")
    return engine_id


PeerKey = Tuple[str, str, int]


@dataclass
class Peer:
    """A remote engine: its engine id, listener address and cluster id, and what we learned on its link."""

    engine_id: str
    host: str
    port: int
    cluster_id: int
    linked: bool = False
    broken: bool = False  # a transfer or notice failed on the link: link again before the next use
    links: int = 0  # successful links (1 + relinks)
    caches: Dict[int, int] = field(default_factory=dict)  # cache key -> remote cache id (this link)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def key(self) -> PeerKey:
        return self.engine_id, self.host, self.port

    def cluster_info(self) -> "kb.ClusterInfo":
        # local_ip_infos must hold one IPv4 entry (CANN V2) but is not used: kvblocks picks the address.
        return kb.ClusterInfo(self.cluster_id, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo(self.host, self.port)])


class Peers:
    """The peers of one kvblocks engine (``dd``). Thread-safe; linking one peer never blocks another's.

    ``max_peers`` bounds the table: params from clients can name any address, and each name costs a
    :class:`Peer` (and a link attempt) only until the table is full (then :class:`ValueError`).
    """

    def __init__(self, dd: "kb.LlmDataDist", link_timeout_ms: int = 3000, max_peers: int = 256):
        self.dd = dd
        self.link_timeout_ms = link_timeout_ms
        self.max_peers = max_peers
        self._lock = threading.Lock()
        self._peers: Dict[PeerKey, Peer] = {}

    def get(self, engine_id: str, host: str, port: int) -> Peer:
        """The peer for ``engine_id`` listening at ``host:port`` (created on first use, not linked yet)."""
        key = (check_id(engine_id), str(host), int(port))
        if not 0 < key[2] < 65536:
            raise ValueError(f"port must be 1..65535, got {port}")
        with self._lock:
            p = self._peers.get(key)
            if p is None:
                if len(self._peers) >= self.max_peers:
                    raise ValueError(f"more than {self.max_peers} peers")
                p = self._peers[key] = Peer(key[0], key[1], key[2], cluster_id_of(key[0]))
            return p

    def by_cluster(self, cluster_id: int) -> List[Peer]:
        """The peers with this cluster id (one, unless an engine id was seen at several addresses)."""
        with self._lock:
            return [p for p in self._peers.values() if p.cluster_id == cluster_id]

    def all(self) -> List[Peer]:
        with self._lock:
            return list(self._peers.values())

    def is_up(self, p: Peer) -> bool:
        """Linked, not marked broken, and the runtime still holds the link (it drops one whose peer died)."""
        return p.linked and not p.broken and self.dd.link_path(p.cluster_id) != ""

    def ensure_linked(self, p: Peer) -> None:
        """Link to ``p`` unless the link is up; a broken link (a failed transfer, a timeout, a dead peer)
        is dropped on this side first. Raises ConnectionError with the runtime's reason on failure."""
        with p.lock:
            if self.is_up(p):
                return
            if p.linked:
                self._drop(p)
            rets = self.dd.link_llm_clusters([p.cluster_info()], timeout_in_millis=self.link_timeout_ms)
            if rets[0] not in (kb.Status.LLM_SUCCESS, kb.Status.LLM_ALREADY_LINK):
                why = self.dd.link_failure(p.cluster_id)
                reason = f"{why.reason}: {why.message}" if why is not None else kb.Status(rets[0]).name
                raise ConnectionError(f"linking to engine {p.engine_id} at {p.host}:{p.port} failed ({reason})")
            p.linked, p.broken = True, False
            p.links += 1

    def mark_broken(self, p: Peer) -> None:
        """A transfer or notice on ``p``'s link failed: the next :meth:`ensure_linked` links again."""
        p.broken = p.broken or p.linked

    def _drop(self, p: Peer) -> None:
        try:
            self.dd.unlink_llm_clusters([p.cluster_info()], force=True)
        except kb.LLMException:
            pass  # already gone on this side
        p.linked = False
        p.caches.clear()  # cache ids are per link table

    def find_cache(self, p: Peer, key: int) -> int:
        """The id of ``p``'s cache registered with ``key`` (the link-time table, or one control round trip
        for a cache registered after the link). Raises kb.CacheNotExistError or kb.LinkError."""
        cid = p.caches.get(key)
        if cid is None:
            cid = p.caches[key] = int(self.dd._find_remote_cache(p.cluster_id, key))
        return cid

    def describe_cache(self, p: Peer, cache_id: int) -> Dict[str, object]:
        """``p``'s cache as its link announced it: num_tensors, tensor_bytes, num_blocks, ..."""
        return self.dd._describe_remote_cache(p.cluster_id, cache_id)

    def close(self) -> None:
        """Forget every peer (their links end with the engine's ``finalize``)."""
        with self._lock:
            self._peers.clear()

