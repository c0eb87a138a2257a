# SPDX-License-Identifier: Apache-2.0
"""kvblocks as the data plane of vLLM's P2P KV offloading tier.

``KvblocksTransport`` implements vLLM's ``DataTransport`` (``vllm.v1.kv_offload.tiering.p2p.data.base``):
the CPU primary tier's block region is registered once as a kvblocks cache, ``write_blocks`` is an
asynchronous kvblocks push over an authenticated link (``kvblocks.AuthToken``), ``poll`` reads the
runtime's transfer handles, and ``cancel`` returns only once the runtime is done with the transfer's
memory, so no byte of a cancelled write lands after it returns.

``KvblocksP2PTierManager`` is vLLM's ``P2PSecondaryTierManager`` with this transport in place of NIXL,
selected by module path until vLLM grows an option for the transport::

    "secondary_tiers": [{"type": "KvblocksP2PTierManager", "module_path": "kvblocks.vllm.p2p_tier",
                         "auth_token": "...", "kvblocks_host": "10.0.0.5"}]

Links are kvblocks.integrations.peers' (one per remote engine, made again after a failure).

Trust: the metadata blob and the layout vLLM hands to ``add_remote_peer`` come from an unauthenticated
control plane. Nothing in them is an address we use: a peer is an (engine id, listener, cache id), the
link to it must prove the token and the cluster id derived from the engine id, and every push names blocks by index, checked against our own cache
here and against the peer's own cache table by its runtime. ``base_addr`` is ignored.
"""
from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import kvblocks as kb
from kvblocks.integrations.peers import Peer, Peers, check_id, cluster_id_of
from vllm.v1.kv_offload.tiering.p2p.data.base import CancelMode, DataTransport, PollResult

logger = logging.getLogger("kvblocks.vllm.p2p_tier")

__all__ = ["KvblocksTransport", "KvblocksP2PTierManager", "MAX_METADATA_BYTES"]

MAX_METADATA_BYTES = 512  # a real blob is about 130 bytes; anything longer is refused unparsed
_METADATA_KEYS = frozenset({"kvblocks_p2p", "engine_id", "host", "port", "cache_id"})
_METADATA_VERSION = 1
_MAX_REMOTE_BLOCKS = 1 << 40
_EMPTY = PollResult(done=(), failed=())
_ONE_TENSOR = kb.KvCacheExtParam(src_layer_range=(-1, -1), dst_layer_range=(-1, -1), tensor_num_per_layer=1)


class PeerRejected(ValueError):
    """add_remote_peer refused a peer (vLLM's handshake catches ValueError and drops the connection)."""


@dataclass
class _Target:
    """What vLLM's peer id names: a kvblocks peer (its link) and the cache of it we push into."""

    peer: Peer
    cache_id: int
    num_blocks: int  # as the peer announced it; its runtime checks the real count

    @property
    def endpoint(self) -> Tuple[int, str, int]:
        return (self.peer.cluster_id, self.peer.host, self.peer.port)


def _int_field(d: Dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:  # bool is not an int here
        raise PeerRejected(f"kvblocks P2P metadata: {key}={v!r} is not an integer in [{lo}, {hi}]")
    return v


def parse_metadata(blob: Any) -> Tuple[str, str, int, int]:
    """(engine id, listener IP, port, cache id) from a peer's ``get_agent_metadata()``; PeerRejected otherwise.

    Strict on purpose: exact keys, exact types, bounded size, an IP literal (no name to resolve).
    """
    if not isinstance(blob, (bytes, bytearray)) or len(blob) > MAX_METADATA_BYTES:
        raise PeerRejected(f"kvblocks P2P metadata: expected at most {MAX_METADATA_BYTES} bytes")
    try:
        d = json.loads(bytes(blob).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise PeerRejected(f"kvblocks P2P metadata is not JSON: {e}") from None
    if not isinstance(d, dict) or set(d) != _METADATA_KEYS:
        raise PeerRejected(f"kvblocks P2P metadata: expected exactly the keys {sorted(_METADATA_KEYS)}")
    _int_field(d, "kvblocks_p2p", _METADATA_VERSION, _METADATA_VERSION)
    host = d["host"]
    try:
        ipaddress.IPv4Address(host)
    except (ipaddress.AddressValueError, TypeError):
        raise PeerRejected(f"kvblocks P2P metadata: host={host!r} is not an IPv4 address") from None
    try:
        engine_id = check_id(d["engine_id"])
    except ValueError as e:
        raise PeerRejected(f"kvblocks P2P metadata: {e}") from None
    return engine_id, host, _int_field(d, "port", 1, 65535), _int_field(d, "cache_id", 1, (1 << 62))


def _as_uint8_blocks(view: memoryview) -> np.ndarray:
    """A writable (num_blocks, block_len) uint8 array over ``view``'s memory (no copy)."""
    arr = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view, dtype=np.uint8)
    return arr.reshape(view.shape[0], -1)


def _check_idxs(idxs: Any, limit: int) -> Optional[List[int]]:
    """The indices as a list when each is an integer (not a bool) in [0, limit); None otherwise."""
    try:
        raw = list(idxs)
    except TypeError:
        return None
    if any(isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) for i in raw):
        return None
    out = [int(i) for i in raw]
    return out if all(0 <= i < limit for i in out) else None


class KvblocksTransport(DataTransport):
    """vLLM's P2P ``DataTransport`` on a kvblocks engine (one per node, like vLLM's NixlTransport).

    Args:
        view: the (num_blocks, block_len) byte region of the CPU primary tier; registered once.
        config_fields: model config fields for vLLM's compatibility fingerprint.
        host: IPv4 address to listen on and to advertise to peers (not 0.0.0.0).
        port: listen port; 0 lets the kernel choose.
        auth_token: the shared secret links must prove (``kvblocks.AuthToken``); defaults to
            ``KVBLOCKS_AUTH_TOKEN``. Required: without it anyone who reaches the port could write the region.
        transport: ``kvblocks.Transport`` (``auto``: shared memory/CMA on one host, TCP across hosts).
        timeout_ms: each write's deadline (``llm.SyncKvCacheWaitTime``): a write to a frozen or dead peer
            surfaces as failed in ``poll`` by then, and ``cancel`` waits at most until then.
        link_timeout_ms: bound of one link attempt (``add_remote_peer``, relink after a failure).
        engine_id: this transport's engine id (its kvblocks cluster id is derived from it); random by default.
        options: more kvblocks options for the engine, e.g. ``{"kvblocks.Encryption": "tls"}``.
    """

    def __init__(self, view: memoryview, config_fields: Optional[dict] = None, *, host: str = "127.0.0.1",
                 port: int = 0, auth_token: Optional[str] = None, transport: str = "auto",
                 timeout_ms: int = 1000, link_timeout_ms: int = 1000, engine_id: Optional[str] = None,
                 options: Optional[Dict[str, str]] = None) -> None:
        super().__init__(view, config_fields=config_fields)
        token = auth_token or os.environ.get("KVBLOCKS_AUTH_TOKEN")
        if not token:
            raise ValueError("KvblocksTransport needs auth_token (or KVBLOCKS_AUTH_TOKEN): without it anyone who "
                             "reaches the listener can write the offloaded KV region")
        ipaddress.IPv4Address(host)
        if host == "0.0.0.0":
            raise ValueError("KvblocksTransport: host is advertised to peers; give the node's routable IPv4 address")
        self._host = host
        self._link_timeout_ms = int(link_timeout_ms)
        self._engine_id = check_id(engine_id or f"vllm-p2p-{uuid.uuid4()}")
        self._cluster_id = cluster_id_of(self._engine_id)
        self._lock = threading.Lock()  # vLLM drives us from one thread; the lock keeps close() safe anyway
        self._targets: Dict[str, _Target] = {}  # vLLM peer id -> target
        self._inflight: Dict[int, Tuple[str, Any]] = {}  # transfer id -> (peer id, kvblocks TransferHandle)
        self._ids = itertools.count(1)
        self._dd: Any = kb.LlmDataDist(self._cluster_id, kb.LlmRole.MIX)
        self._dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport,
                             kb.OPTION_SYNC_CACHE_WAIT_TIME: str(int(timeout_ms)), **(options or {}),
                             kb.OPTION_LISTEN_IP_INFO: f"{host}:{int(port)}", kb.OPTION_AUTH_TOKEN: token})
        try:
            self._cache = self._dd.register_arrays([_as_uint8_blocks(view)])
        except Exception:
            self._dd.finalize()
            raise
        self._port = int(self._dd.listen_address.rsplit(":", 1)[1])
        self._links = Peers(self._dd, link_timeout_ms=self._link_timeout_ms)

    # ------------------------------------------------------------------ identity

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def engine_id(self) -> str:
        return self._engine_id

    def get_agent_metadata(self) -> bytes:
        """What a peer needs to reach our region: engine id, listener and cache id (no address, no secret)."""
        return json.dumps({"kvblocks_p2p": _METADATA_VERSION, "engine_id": self._engine_id, "host": self._host,
                           "port": self._port, "cache_id": self._cache.cache_id}, sort_keys=True).encode()

    # ------------------------------------------------------------------ peers

    def add_remote_peer(self, peer_id: str, agent_metadata: bytes, base_addr: int, num_blocks: int,
                        block_len: int) -> None:
        """Checks the peer's metadata and layout, then links to it (the link proves the token)."""
        del base_addr  # an address from the control plane is never used: pushes name blocks by index
        if type(block_len) is not int or block_len != self._block_len:
            raise PeerRejected(f"kvblocks P2P peer {peer_id}: block_len {block_len!r} != ours {self._block_len}")
        if type(num_blocks) is not int or not 0 < num_blocks <= _MAX_REMOTE_BLOCKS:
            raise PeerRejected(f"kvblocks P2P peer {peer_id}: num_blocks {num_blocks!r} out of range")
        engine_id, host, port, cache_id = parse_metadata(agent_metadata)
        with self._lock:
            self._check_new_peer(peer_id, engine_id, host, port)
            try:
                target = _Target(self._links.get(engine_id, host, port), cache_id, num_blocks)
                self._links.ensure_linked(target.peer)
            except (ValueError, ConnectionError) as e:
                raise PeerRejected(f"kvblocks P2P peer {peer_id}: {e}") from None
            self._targets[peer_id] = target

    def _check_new_peer(self, peer_id: str, engine_id: str, host: str, port: int) -> None:
        # One link per cluster id: a second peer id claiming a linked endpoint would get another peer's writes.
        if engine_id == self._engine_id or (host, port) == (self._host, self._port):
            raise PeerRejected(f"kvblocks P2P peer {peer_id}: metadata names this transport itself")
        cid = cluster_id_of(engine_id)
        old = self._targets.get(peer_id)
        if old is not None and old.endpoint != (cid, host, port):
            raise PeerRejected(f"kvblocks P2P peer {peer_id}: already registered with another endpoint")
        for other_id, other in self._targets.items():
            if other_id != peer_id and (other.peer.cluster_id == cid or
                                        (other.peer.host, other.peer.port) == (host, port)):
                raise PeerRejected(f"kvblocks P2P peer {peer_id}: cluster or listener already held by {other_id}")

    def remove_remote_peer(self, peer_id: str) -> None:
        """Waits out the peer's writes in flight (no byte lands after), then unlinks."""
        with self._lock:
            ids = [tid for tid, (pid, _) in self._inflight.items() if pid == peer_id]
            self._cancel_now(ids)
            target = self._targets.pop(peer_id, None)
            if target is not None:
                self._unlink(target.peer)

    def _unlink(self, p: Peer) -> None:
        """Tells the peer (it drops its side), or drops ours alone when it does not answer."""
        try:
            self._dd.unlink_llm_clusters([p.cluster_info()], timeout_in_millis=self._link_timeout_ms,
                                         force=p.broken)
        except kb.LLMException:
            try:
                self._dd.unlink_llm_clusters([p.cluster_info()], force=True)
            except kb.LLMException:
                pass
        p.linked = False

    # ------------------------------------------------------------------ transfers

    def write_blocks(self, peer_id: str, local_idxs: List[int], remote_idxs: List[int]) -> Optional[int]:
        """Submits one push of local blocks into the peer's blocks; the id surfaces in ``poll``.

        None when the peer is unknown or unreachable, or an index is out of range (ours, or the count the
        peer announced; its runtime checks its real one). Does not wait for the data.
        """
        with self._lock:
            target = self._targets.get(peer_id)
            if target is None or self._dd is None:
                return None
            src = _check_idxs(local_idxs, self._num_blocks)
            dst = _check_idxs(remote_idxs, target.num_blocks)
            if src is None or dst is None or len(src) != len(dst) or not src:
                logger.warning("kvblocks P2P write to %s refused: bad block indices", peer_id)
                return None
            p = target.peer
            try:
                self._links.ensure_linked(p)  # at once when up; a link again after a failure (bounded)
            except ConnectionError as e:
                logger.warning("kvblocks P2P write to %s refused: %s", peer_id, e)
                return None
            try:
                h = self._dd.push_kv_blocks_async(self._cache, kb.CacheIndex(p.cluster_id, target.cache_id), src, dst,
                                                 _ONE_TENSOR)
            except kb.LLMException as e:
                if isinstance(e, (kb.LinkError, kb.LLMTimeoutError)):
                    self._links.mark_broken(p)
                logger.warning("kvblocks P2P write to %s failed at submission: %s", peer_id, e)
                return None
            tid = next(self._ids)
            self._inflight[tid] = (peer_id, h)
            return tid

    def poll(self, peer_id: Optional[str] = None) -> PollResult:
        """Transfers (of ``peer_id``, or all) the runtime finished since the last poll: done or failed."""
        with self._lock:
            done: List[int] = []
            failed: List[int] = []
            for tid, (pid, h) in list(self._inflight.items()):
                if (peer_id is not None and pid != peer_id) or not h.done():
                    continue
                del self._inflight[tid]
                (done if self._settle(pid, h) else failed).append(tid)
            return PollResult(done=done, failed=failed) if done or failed else _EMPTY

    def _settle(self, peer_id: str, h: Any) -> bool:
        """True when a finished handle succeeded; a failure marks the peer's link for a relink."""
        if h.status == kb.Status.LLM_SUCCESS:
            return True
        target = self._targets.get(peer_id)
        if target is not None:
            self._links.mark_broken(target.peer)
        return False

    def cancel(self, transfer_ids: Iterable[int], mode: CancelMode = "immediate") -> List[int]:
        """Cancels writes; a cancelled id never surfaces in ``poll``.

        kvblocks cannot recall bytes already sent, so "immediate" waits (GIL released) until the runtime is
        done with each transfer, at most until its deadline (``timeout_ms`` from its submission): once it
        returns no byte of those writes lands. "wait" does not wait: it returns the ids still in flight,
        which surface in ``poll`` once no byte of theirs can land any more.
        """
        with self._lock:
            ids = [tid for tid in transfer_ids if tid in self._inflight]
            if mode == "immediate":
                self._cancel_now(ids)
                return []
            still = []
            for tid in ids:
                pid, h = self._inflight[tid]
                if h.done():
                    del self._inflight[tid]
                    self._settle(pid, h)
                else:
                    still.append(tid)
            return still

    def _cancel_now(self, ids: List[int]) -> None:
        for tid in ids:
            pid, h = self._inflight.pop(tid)
            try:
                h.wait()  # returns by the transfer's own deadline
            except Exception:  # noqa: BLE001 - any failure is the transfer's: it is over either way
                pass
            self._settle(pid, h)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Waits out writes in flight, unlinks every peer, unregisters the region, shuts the engine down."""
        with self._lock:
            if self._dd is None:
                return
            self._cancel_now(list(self._inflight))
            for target in self._targets.values():
                if target.peer.linked:
                    self._unlink(target.peer)
            self._targets.clear()
            self._links.close()
            try:
                self._dd.unregister_kv_cache(self._cache)
            except kb.LLMException as e:
                logger.warning("kvblocks P2P close: unregister failed: %s", e)
            self._dd.finalize()
            self._dd = None
            self._cache = None
            self._view = None  # our views of the region go, so its owner can unmap it


def _transport_factory(opts: Dict[str, Any]):
    """A stand-in for vLLM's ``NixlTransport(...)`` call that builds a KvblocksTransport instead."""

    def make(agent_name: str, view: memoryview, config_fields: Optional[dict] = None, **_nixl: Any):
        return KvblocksTransport(view, config_fields=config_fields, **opts)

    return make


_SWAP_LOCK = threading.Lock()


def _tier_manager_class():
    """Builds the manager class on first use, so importing this module does not import the P2P tier."""
    from vllm.v1.kv_offload.tiering.p2p import manager as p2p_manager

    class KvblocksP2PTierManager(p2p_manager.P2PSecondaryTierManager):
        """vLLM's P2P tier with kvblocks as its data plane.

        Tier options (besides the P2P tier's own ``host``, ``port``, ``unbound_store_timeout_s``):
        ``auth_token``, ``kvblocks_host`` (default: the P2P ``host``), ``kvblocks_port`` (default 0),
        ``kvblocks_transport``, ``kvblocks_timeout_ms``, ``kvblocks_link_timeout_ms``, ``kvblocks_options``.
        """

        def __init__(self, offloading_spec: Any, primary_kv_view: memoryview,
                     tier_type: str = "KvblocksP2PTierManager", **kwargs: Any) -> None:
            opts = {"auth_token": kwargs.pop("auth_token", None),
                    "host": kwargs.pop("kvblocks_host", None) or _ipv4_of(kwargs.get("host")),
                    "port": int(kwargs.pop("kvblocks_port", 0)),
                    "transport": kwargs.pop("kvblocks_transport", "auto"),
                    "timeout_ms": int(kwargs.pop("kvblocks_timeout_ms", 1000)),
                    "link_timeout_ms": int(kwargs.pop("kvblocks_link_timeout_ms", 1000)),
                    "options": {str(k): str(v) for k, v in (kwargs.pop("kvblocks_options", None) or {}).items()}}
            # vLLM constructs NixlTransport by name inside P2PSecondaryTierManager.__init__ and has no option
            # for another transport yet: swap the name for the duration of that call only.
            with _SWAP_LOCK:
                saved = p2p_manager.NixlTransport
                p2p_manager.NixlTransport = _transport_factory(opts)
                try:
                    super().__init__(offloading_spec, primary_kv_view, tier_type, **kwargs)
                finally:
                    p2p_manager.NixlTransport = saved

    return KvblocksP2PTierManager


def _ipv4_of(host: Optional[str]) -> str:
    """The IPv4 address for a P2P ``host`` (vLLM's default is ``localhost``)."""
    import socket

    from vllm import envs

    return socket.gethostbyname(host or envs.VLLM_P2P_SIDE_CHANNEL_HOST)


def __getattr__(name: str) -> Any:
    if name == "KvblocksP2PTierManager":
        cls = _tier_manager_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
