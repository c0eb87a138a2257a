# SPDX-License-Identifier: Apache-2.0
"""``KvblocksConnector``: vLLM disaggregated prefill/decode over kvblocks, in the pull model of NixlConnector.

The glue on :mod:`kvblocks.integrations`: peers (one link per prefill, relinked when broken, the prefill's
KV cache found by key in the link-time table), layouts (vLLM's per-layer tensors registered once as one
kvblocks cache, compared field by field), notices (done / abort over the runtime's notifications, bound
to the decode holding the request's ticket) and completion through the runtime's async handles. There is
no side channel and no second port: everything rides the kvblocks link.

Flow (one request):

1. The client (or a proxy) sends the prompt to the **prefill** instance with
   ``kv_transfer_params={"do_remote_decode": True}`` and ``max_tokens=1``. When it finishes, the prefill
   scheduler's :meth:`KvblocksConnector.request_finished` keeps the request's blocks (delayed free) and
   returns ``kv_transfer_params``: engine id, kvblocks address, block ids, number of computed tokens, the
   KV layout and a random **ticket** (whoever holds it may release the blocks).
2. The client sends the same prompt with those params to the **decode** instance. Its scheduler's
   :meth:`get_num_new_matched_tokens` answers ``(n, True)`` (n tokens will be loaded asynchronously),
   :meth:`update_state_after_alloc` records the local blocks vLLM allocated for them, and
   :meth:`build_connector_meta` hands the (remote blocks -> local blocks) job to the worker.
3. The decode worker's :meth:`start_load_kv` submits the pull of every layer's blocks as one
   ``pull_kv_blocks_async`` (linking first, once per prefill, on the connector's control thread);
   :meth:`get_finished` reports the request as received when the handle completes and sends the prefill
   a ``done`` notice (with the ticket) over the link. Failed blocks go to
   :meth:`get_block_ids_with_load_errors` so that vLLM recomputes them (use
   ``kv_load_failure_policy="recompute"`` on the decode instance).
4. The prefill worker's :meth:`get_finished` reports the request as sent (its blocks are freed) once the
   decode holding the ticket said done (or abort), or when the lease (``abort_timeout_s``) expires.

Layer-wise push (per request, ``"mode": "push"`` in the params, see the README): the decode gets the request
first, reserves its blocks and tells the prefill which (a ``reserve`` notice); the prefill pushes each
layer into them as :meth:`save_kv_layer` reports it computed, waits in :meth:`wait_for_save` and says done.

The KV cache must be host memory (vLLM's CPU backend): kvblocks moves host memory.
A prefill and a decode with different block sizes work (pull): the pull is then kvblocks' layout transform
(:func:`kvblocks.integrations.layouts.plan`), checked by :func:`kvblocks.integrations.layouts.compatible`.

Tensor parallelism: every TP rank's worker has its own kvblocks engine (cluster id and cache key from
:func:`rank_engine_id`), listening on the ``listen`` port + rank; the params carry the prefill's
``tp_size`` and ``rank_ports``. A decode rank pulls from the prefill rank(s) holding its KV heads
(:func:`kvblocks.integrations.layouts.tp_sources`; a head slice when the TP sizes differ, one pull per
prefill rank) and tells each ``done`` with the number of decode ranks pulling from it, which frees the
blocks after that many. Pull only (layer-wise push needs TP 1 on both sides); KV heads split evenly on
both sides (no replicated KV heads).

Options (``kv_connector_extra_config``):

==================== ========================================================================================
``listen``           ``ip:port`` of the prefill's kvblocks listener (kv_producer and kv_both; required there)
``advertise_host``   the host decode instances use to reach this prefill (default: the ``listen`` ip; needed
                     when listening on ``0.0.0.0``)
``transport``        ``auto`` (default: shared memory on one host, TCP between hosts), ``tcp``, ``shm``
``auth_token``       shared secret of the kvblocks links (default: ``KVBLOCKS_AUTH_TOKEN``)
``pull_timeout_ms``  deadline of one pull (``llm.SyncKvCacheWaitTime``), default 5000
``link_timeout_ms``  deadline of linking to a prefill and of a notice's acknowledgement, default 3000
``abort_timeout_s``  lease: the prefill frees a request's blocks after this long even without a "done",
                     default 120
==================== ========================================================================================
"""
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvblocks as kb
from kvblocks.integrations import layouts, notices
from kvblocks.integrations.completion import Transfers
from kvblocks.integrations.peers import Peer, Peers, cache_key_of, check_id
from kvblocks.integrations.peers import cluster_id_of as cluster_id_of  # re-exported (tests, tools)
from kvblocks.vllm.stats import EngineDelta, KvblocksConnectorStats, KvblocksPromMetrics

if TYPE_CHECKING:
    from vllm.attention.backends.abstract import AttentionMetadata
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.kvblocks")  # under "vllm": shown with vLLM's log settings

# vLLM's null block (the block pool's first, never read by full attention): a transformed pull writes
# the tokens of a block-size group that are not this request's there
NULL_BLOCK = 0
PARAMS_KEY = "kvblocks"  # kv_transfer_params["kvblocks"] holds our fields (besides Nixl-style generic ones)

@dataclass
class _Options:
    """Parsed ``kv_connector_extra_config``."""

    listen: Optional[Tuple[str, int]]
    advertise_host: Optional[str]
    transport: str
    auth_token: Optional[str]
    pull_timeout_ms: int
    link_timeout_ms: int
    abort_timeout_s: float
    test_reverse_blocks: str  # "off", "all", "per_request"
    test_rotate_heads: str  # "off", "all", "per_request" (transformed pulls only)
    test_swap_ranks: str  # "off", "all", "per_request" (unequal tensor parallelism only)

    @classmethod
    def parse(cls, extra: Dict[str, Any]) -> "_Options":
        known = {"listen", "advertise_host", "transport", "auth_token", "pull_timeout_ms", "link_timeout_ms",
                 "abort_timeout_s", "_test_reverse_blocks", "_test_rotate_heads", "_test_swap_ranks"}
        unknown = set(extra) - known
        if unknown:
            raise ValueError(f"KvblocksConnector: unknown kv_connector_extra_config keys {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        listen = None
        if extra.get("listen"):
            host, sep, port = str(extra["listen"]).rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"KvblocksConnector: listen must be 'ip:port', got {extra['listen']!r}")
            listen = (host, int(port))
        transport = str(extra.get("transport", "auto"))
        if transport not in ("auto", "tcp", "shm"):
            raise ValueError(f"KvblocksConnector: transport must be auto, tcp or shm, got {transport!r}")
        return cls(
            listen=listen,
            advertise_host=extra.get("advertise_host"),
            transport=transport,
            auth_token=extra.get("auth_token") or os.environ.get("KVBLOCKS_AUTH_TOKEN") or None,
            pull_timeout_ms=int(extra.get("pull_timeout_ms", 5000)),
            link_timeout_ms=int(extra.get("link_timeout_ms", 3000)),
            abort_timeout_s=float(extra.get("abort_timeout_s", 120)),
            test_reverse_blocks=_reverse_mode(extra.get("_test_reverse_blocks", False)),
            test_rotate_heads=_reverse_mode(extra.get("_test_rotate_heads", False)),
            test_swap_ranks=_reverse_mode(extra.get("_test_swap_ranks", False)),
        )


def _is_push(info: Any) -> bool:
    """The client asked for a layer-wise push (``"mode": "push"`` in our params) instead of a pull."""
    return isinstance(info, dict) and info.get("mode") == "push"


def _reverse_mode(v: Any) -> str:
    """Tests only: ``_test_reverse_blocks`` true pulls every request's blocks in reverse order (a wrong
    mapping the output must show); ``"per_request"`` only for requests whose kv_transfer_params say
    ``"_test_reverse_blocks": true``."""
    if v == "per_request":
        return v
    return "all" if v in (True, "true", "1", 1) else "off"


def _test_mode(mode: str, params: Dict[str, Any], key: str) -> bool:
    """Tests only: is the deliberately wrong mapping ``key`` on for this request?"""
    return mode == "all" or (mode == "per_request" and bool(params.get(key)))


def _cpu_interior(vllm_config: Optional["VllmConfig"]) -> bool:
    """vLLM's CPU attention backend with layout LBHNC: a block of a layer holds, per KV head, K as [head
    size, tokens] and then V as [tokens, head size] (its tensor [blocks, heads, block_size, 2 * head_size];
    the shape is checked against the real tensors in register_kv_caches)."""
    try:
        from vllm.platforms import current_platform
        if vllm_config is None or not current_platform.is_cpu():
            return False
        return vllm_config.cache_config.get_resolved_kv_cache_layout().name == "LBHNC"
    except Exception:  # noqa: BLE001 - unknown vLLM: no transforms, equal layouts still work
        return False


def vllm_layout(kv_cache_config: "KVCacheConfig", vllm_config: Optional["VllmConfig"] = None) -> layouts.Layout:
    """What both sides must agree on, from vLLM's KV cache spec: layers (one kvblocks tensor each), bytes
    of a block of a layer, dtype, block shape, tokens per block and the spec kind. On vLLM's CPU backend
    the block shape is ``(heads, 2, block_size, head_size)`` with ``extra["interior"] = "vllm-cpu"`` (see
    ``layouts.INTERIORS``), which lets a decode pull from a prefill with another block size. One KV cache group (this connector
    turns HMA off)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise NotImplementedError(f"KvblocksConnector supports one KV cache group, got {len(groups)}")
    s = groups[0].kv_cache_spec
    dtype = str(getattr(s, "dtype", "uint8")).replace("torch.", "")
    itemsize = int(getattr(getattr(s, "dtype", None), "itemsize", 1))
    heads, head = getattr(s, "num_kv_heads", None), getattr(s, "head_size", None)
    page = int(s.page_size_bytes)
    shape: Tuple[int, ...] = (page // itemsize,)
    extra: Tuple[Tuple[str, Any], ...] = (("spec", type(s).__name__),)
    if heads and head and 2 * s.block_size * heads * head * itemsize == page:
        shape = (2, s.block_size, heads, head)
        if _cpu_interior(vllm_config):
            shape, extra = (heads, 2, s.block_size, head), (("interior", "vllm-cpu"),) + extra
    return layouts.Layout(len(groups[0].layer_names), kv_cache_config.num_blocks, page, dtype, shape,
                          s.block_size, extra)


@dataclass
class _RecvJob:
    """One request's pull: remote blocks -> local blocks, and whom to notify."""

    req_id: str
    local_block_ids: List[int]
    remote_block_ids: List[int]
    params: Dict[str, Any]
    report: bool = True  # False: only notify the prefill (no local blocks wait for it)
    t0: float = 0.0  # when the worker got it (hand-off time)
    push_offset: int = -1  # >= 0: layer-wise push: the prefill's blocks from this index land in ours
    # tokens: remote_block_ids[0] starts at token src_token0, local_block_ids[0] at dst_token0; the pull
    # moves tokens [dst_token0, num_tokens) (block-for-block when both sides' block sizes are equal)
    src_token0: int = 0
    dst_token0: int = 0
    num_tokens: int = 0
    bytes: int = 0  # what the pull moves (stats)
    # the prefill ranks this worker pulls from (one, unless the tensor parallelism differs), each with
    # the heads it takes there (set by the worker)
    sources: List[Tuple[Peer, layouts.RankSource]] = field(default_factory=list)


@dataclass
class _Group:
    """The transfers of one transformed pull: it is finished when the last is (failed if any failed)."""

    remaining: int
    error: Optional[str] = None


@dataclass
class _PushJob:
    """Prefill side, layer-wise push: this step computes the rest of ``xfer``'s prompt; push its blocks
    into those the decode ``decode_engine_id`` reserved."""

    xfer: str
    decode_engine_id: str
    block_ids: List[int]


@dataclass
class KvblocksConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, once per step.

    Attributes:
        reqs_to_recv: decode side, the pulls to start this step.
        reqs_to_send: prefill side, requests whose blocks wait for a pull: id -> (lease in seconds, ticket).
        reqs_to_push: prefill side (mode push), requests whose prompt this step completes.
    """

    reqs_to_recv: Dict[str, _RecvJob] = field(default_factory=dict)
    reqs_to_send: Dict[str, Tuple[float, str]] = field(default_factory=dict)
    reqs_to_push: Dict[str, _PushJob] = field(default_factory=dict)


def _tp_rank() -> int:
    """This worker's tensor-parallel rank (vLLM sets its groups up before the KV connector)."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return int(get_tensor_model_parallel_rank())


def rank_engine_id(engine_id: str, tp: int, rank: int) -> str:
    """The id of tensor-parallel rank ``rank``'s kvblocks engine (its cluster id and cache key derive
    from it): the engine id itself for rank 0 (and TP 1), ``ENGINE_ID#tpR`` for the others."""
    return engine_id if rank == 0 else f"{engine_id}#tp{rank}"


def _allow_amx() -> None:
    """Asks Linux for the AMX tile state in this worker, where the CPU has it. vLLM's CPU attention
    runs AMX instructions (bf16, block size 32) without asking; a decode worker whose first forward
    is one token after a remote prefill, so that no larger op asked first, died of SIGILL there
    (seen on a 2-vCPU Xeon VM). Raises nothing; a no-op elsewhere."""
    init, has = getattr(torch.cpu, "_init_amx", None), getattr(torch.cpu, "_is_amx_tile_supported", None)
    if init is not None and has is not None and has():
        init()


class KvblocksConnector(KVConnectorBase_V1):
    """vLLM KV connector (V1 API) moving a finished prefill's KV blocks to a decode instance with kvblocks.

    Configure with ``KVTransferConfig(kv_connector="KvblocksConnector",
    kv_connector_module_path="kvblocks.vllm", kv_role="kv_producer" | "kv_consumer" | "kv_both",
    kv_connector_extra_config={...})``; see the module docstring for the options.
    """

    _cache_hit_source = CacheHitSource.P2P  # loaded tokens come from a peer instance

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self._opts = _Options.parse(dict(ktc.kv_connector_extra_config or {}))
        self._kv_role = ktc.kv_role
        self._engine_id: str = ktc.engine_id
        self._is_producer = self._kv_role in ("kv_producer", "kv_both")
        self._is_consumer = self._kv_role in ("kv_consumer", "kv_both")
        if self._is_producer and self._opts.listen is None:
            raise ValueError("KvblocksConnector: kv_role %r needs kv_connector_extra_config['listen'] = 'ip:port' "
                             "(the kvblocks listener decode instances link to)" % self._kv_role)
        pc = vllm_config.parallel_config
        if pc.pipeline_parallel_size != 1:
            raise NotImplementedError("KvblocksConnector supports pipeline_parallel_size=1 only")
        self._tp = int(pc.tensor_parallel_size)
        if not 0 < self._tp <= notices.MAX_PULLERS:
            raise NotImplementedError(f"KvblocksConnector supports tensor_parallel_size 1..{notices.MAX_PULLERS}")
        # each tensor-parallel rank's worker has its own kvblocks engine, listener (port + rank) and cache
        self._rank = _tp_rank() if role != KVConnectorRole.SCHEDULER and self._tp > 1 else 0
        self._block_size = vllm_config.cache_config.block_size
        self._layout = vllm_layout(kv_cache_config, vllm_config) if kv_cache_config is not None else None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _SchedulerSide(self)
            self._worker: Optional[_WorkerSide] = None
        else:
            self._sched = None  # type: ignore[assignment]
            _allow_amx()
            self._worker = _WorkerSide(self)

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        """Register vLLM's KV tensors with kvblocks, once: one kvblocks cache whose tensor ``l`` is layer
        ``l`` seen as ``[num_blocks, page bytes]``, so one pull moves a block of every layer; registered
        under a key derived from the engine id, which decodes find in the link-time table."""
        assert self._worker is not None
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        """Submit this step's pulls (decode; async handles, linking first on the control thread where
        needed) and record the prefill's held requests; returns at once (loads are asynchronous: vLLM
        waits via :meth:`get_finished`)."""
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvblocksConnectorMetadata)
        self._worker.start(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: loads are whole-request and asynchronous (the request only runs once its
        KV is reported finished), not layer by layer."""
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        """Mode push (prefill): this layer's KV of the requests whose prompt this step completes is
        computed: hand it to their layer-wise pushes (sent while later layers compute). Mode pull: nothing."""
        assert self._worker is not None
        meta = self._get_connector_metadata()  # bound before the forward (start_load_kv may come after it)
        if isinstance(meta, KvblocksConnectorMetadata) and meta.reqs_to_push:
            self._worker.layer_computed(layer_name, meta.reqs_to_push)

    def wait_for_save(self) -> None:
        """Mode push (prefill): wait for this step's layer-wise pushes to land and tell each decode (done,
        or abort when a push failed); the blocks may be freed afterwards. Mode pull: nothing."""
        assert self._worker is not None
        self._worker.finish_pushes()

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """Return (finished sending, finished receiving) request ids since the last call.

        Sending (prefill): the decode notified "done", or the lease expired; vLLM then frees the blocks.
        Receiving (decode): the pull finished, successfully or not; failed blocks are reported by the
        next :meth:`get_block_ids_with_load_errors` call (same step).
        """
        assert self._worker is not None
        sending, recving = self._worker.finished()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        """Local block ids whose pull failed (peer dead, frozen, unreachable, layout mismatch): vLLM
        recomputes them (with ``kv_load_failure_policy="recompute"``)."""
        assert self._worker is not None
        return self._worker.take_load_errors()

    def get_kv_connector_stats(self) -> Optional[KvblocksConnectorStats]:
        """This interval's pulls and kvblocks engine counters (vLLM logs them and shows them on /metrics
        as ``vllm:kvblocks_*``); None when nothing happened, and on the scheduler side."""
        return self._worker.take_stats() if self._worker is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> KvblocksConnectorStats:
        return KvblocksConnectorStats(data=data) if data is not None else KvblocksConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: Dict[Any, Any], labelnames: List[str],
                           per_engine_labelvalues: Dict[int, List[object]]) -> KvblocksPromMetrics:
        return KvblocksPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        """Stop the control thread and release the kvblocks engine (its transfers in flight end)."""
        if self._worker is not None:
            self._worker.shutdown()

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> Tuple[int, bool]:
        """Decode side: a request carrying a prefill's params gets all its prompt tokens (beyond local
        prefix hits) from the prefill, asynchronously: ``(n, True)``. Anything else: ``(0, False)``."""
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        """Decode side: record which local blocks the pull fills (the blocks vLLM allocated beyond the
        local prefix hits), paired with the prefill's blocks, for the next :meth:`build_connector_meta`."""
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """Hand this step's new pulls (decode) and newly delayed frees (prefill) to the worker."""
        return self._sched.build_meta(scheduler_output)

    def request_finished(self, request: "Request", block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Prefill side: a request asked for with ``do_remote_decode`` that finished normally keeps its
        blocks (True: freed when the worker reports it sent) and returns the ``kv_transfer_params`` the
        decode needs. Decode side: a request aborted before its pull was scheduled notifies the prefill
        so it frees its blocks early."""
        return self._sched.request_finished(request, block_ids)

    def get_loaded_kv_cache_group_ids(self, request: "Request") -> Tuple[int, ...]:
        """The KV cache groups a load restores: all transfer groups (the pull moves the request's own
        blocks, not a hash-addressed store), so vLLM does not zero the blocks being filled."""
        return tuple(self._kv_cache_config.transfer_group_ids)

    def has_pending_block_frees(self) -> bool:
        """False: blocks kept for a decode are freed by its "done" or by the lease (up to
        ``abort_timeout_s``), too late to wait for instead of preempting."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> Optional[str]:
        """No preference: any layout where a block of a layer is one contiguous chunk works, checked in
        :meth:`register_kv_caches` and through the layout hash."""
        return None


# ====================================================================== scheduler side


class _SchedulerSide:
    def __init__(self, c: KvblocksConnector):
        self.c = c
        self._recv: Dict[str, _RecvJob] = {}
        self._send: Dict[str, Tuple[float, str]] = {}
        self._push_wanted: Dict[str, Tuple[str, str]] = {}  # prefill, mode push: rid -> (xfer, decode engine)
        if c._is_producer:
            host, port = c._opts.listen  # type: ignore[misc]
            self._adv_host = c._opts.advertise_host or host
            if self._adv_host in ("0.0.0.0", ""):
                raise ValueError("KvblocksConnector: listening on 0.0.0.0 needs advertise_host")
            self._port = port

    @staticmethod
    def _ours(params: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if params and params.get("do_remote_prefill") and isinstance(params.get(PARAMS_KEY), dict):
            return params
        return None

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> Tuple[int, bool]:
        params = self._ours(request.kv_transfer_params)
        if params is None or not self.c._is_consumer:
            return 0, False
        info = params[PARAMS_KEY]
        # push: the prefill computes the whole prompt into our blocks; pull: what the prefill computed
        remote_tokens = request.num_prompt_tokens if _is_push(info) else int(info.get("num_tokens", 0))
        count = min(remote_tokens, request.num_prompt_tokens) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        self._want_push(request)
        params = self._ours(request.kv_transfer_params)
        if params is None or not self.c._is_consumer:
            return
        info = params[PARAMS_KEY]
        remote = [int(b) for b in info.get("block_ids", [])]
        if num_external_tokens > 0:
            (group,) = blocks.blocks  # single KV cache group (HMA is off for this connector)
            hashed = sum(1 for b in group if b.block_hash is not None)  # local prefix-cache hits
            bs = self.c._block_size
            total = hashed * bs + num_external_tokens  # hashed blocks are full blocks
            n_blocks = (total + bs - 1) // bs
            local = [b.block_id for b in group[hashed:n_blocks]]
            theirs = _remote_block_size(info, bs)
            if theirs == bs:  # block for block
                job = _RecvJob(request.request_id, local, remote[hashed:n_blocks], dict(params),
                               push_offset=hashed if _is_push(info) else -1)
            else:  # the prefill's blocks from token 0 on; the worker plans the transform
                job = _RecvJob(request.request_id, local, remote[:(total + theirs - 1) // theirs], dict(params),
                               push_offset=hashed if _is_push(info) else -1)
            job.src_token0 = 0 if theirs != bs else hashed * bs
            job.dst_token0, job.num_tokens = hashed * bs, total
        else:
            job = _RecvJob(request.request_id, [], [], dict(params), report=False)  # full local hit
        self._recv[request.request_id] = job
        params["do_remote_prefill"] = False  # one transfer per request

    def _want_push(self, request: "Request") -> None:
        """Prefill, mode push: remember a request the client asked to push (its transfer id and decode)."""
        params = request.kv_transfer_params or {}
        info = params.get(PARAMS_KEY)
        if self.c._kv_role == "kv_producer" and params.get("do_remote_decode") and _is_push(info):
            if self.c._tp != 1:
                logger.warning("KvblocksConnector: request %s: layer-wise push needs tensor parallelism 1; "
                               "not pushing", request.request_id)
                return
            try:
                self._push_wanted[request.request_id] = (str(info["xfer"]), check_id(str(info["decode_engine_id"])))
            except (KeyError, ValueError) as e:
                logger.warning("KvblocksConnector: request %s: bad push params (%s); not pushing",
                               request.request_id, e)

    def build_meta(self, scheduler_output: Optional["SchedulerOutput"] = None) -> KvblocksConnectorMetadata:
        meta = KvblocksConnectorMetadata(reqs_to_recv=self._recv, reqs_to_send=self._send,
                                         reqs_to_push=self._pushes_of(scheduler_output))
        self._recv, self._send = {}, {}
        return meta

    def _pushes_of(self, out: Optional["SchedulerOutput"]) -> Dict[str, _PushJob]:
        """The push-mode requests whose whole prompt this step computes (a prompt split over several steps
        is not pushed: the decode's lease runs out and it recomputes)."""
        if out is None or not self._push_wanted:
            return {}
        jobs = {}
        for r in out.scheduled_new_reqs:
            want = self._push_wanted.pop(r.req_id, None)
            if want is None:
                continue
            n_prompt = len(r.prompt_token_ids or [])
            if r.num_computed_tokens + out.num_scheduled_tokens.get(r.req_id, 0) < n_prompt:
                logger.warning("KvblocksConnector: request %s: prompt split over steps; not pushed", r.req_id)
                continue
            n_blocks = (n_prompt + self.c._block_size - 1) // self.c._block_size
            jobs[r.req_id] = _PushJob(want[0], want[1], list(r.block_ids[0][:n_blocks]))
        return jobs

    def request_finished(self, request: "Request", block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        from vllm.v1.request import RequestStatus

        params = request.kv_transfer_params
        if not params:
            return False, None
        if self._ours(params) is not None:
            # Decode side, aborted before scheduling: let the prefill free its blocks now.
            self._recv[request.request_id] = _RecvJob(request.request_id, [], [], dict(params), report=False)
            params["do_remote_prefill"] = False
            return False, None
        if not params.get("do_remote_decode") or not self.c._is_producer:
            return False, None
        self._push_wanted.pop(request.request_id, None)
        if _is_push(params.get(PARAMS_KEY) or {}):
            return False, None  # pushed during the forward (wait_for_save waited for it): free now
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted: nothing to hand off
        n_tokens = request.num_computed_tokens
        n_blocks = (n_tokens + self.c._block_size - 1) // self.c._block_size
        blocks = list(block_ids[:n_blocks])
        if not blocks:
            return False, None
        ticket = notices.new_ticket()
        self._send[request.request_id] = (self.c._opts.abort_timeout_s, ticket)
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.c._engine_id,
            "remote_request_id": request.request_id,
            PARAMS_KEY: {
                "engine_id": self.c._engine_id,
                "request_id": request.request_id,
                "host": self._adv_host,
                "port": self._port,
                # tensor parallelism: rank r's engine is rank_engine_id(engine_id, tp_size, r) at
                # host:rank_ports[r] and holds KV heads [r h, (r + 1) h) of the model (h: the layout's)
                "tp_size": self.c._tp,
                "rank_ports": [self._port + r for r in range(self.c._tp)],
                "block_ids": blocks,
                "num_tokens": n_tokens,
                "layout": self.c._layout.to_dict() if self.c._layout is not None else None,
                "ticket": ticket,  # whoever holds it may release the blocks (and nobody else)
            },
        }


def _remote_block_size(info: Dict[str, Any], ours: int) -> int:
    """The prefill's tokens per block, as its params' layout says (ours when they say nothing usable)."""
    try:
        bs = int((info.get("layout") or {}).get("block_size") or ours)
    except (TypeError, ValueError, AttributeError):
        return ours
    return bs if 0 < bs <= 1 << 20 else ours


# ====================================================================== worker side


def _cache_key(engine_id: str) -> int:
    """The key a prefill registers its KV cache under: decodes find it in the link-time table."""
    return cache_key_of("vllm-kv/" + engine_id)


def _check_interior(spec: layouts.Layout, t: torch.Tensor) -> None:
    """The tensor is the one the layout's interior (vllm-cpu) describes: [blocks, heads, block_size, 2 * head]."""
    h, _, bs, d = spec.block_shape
    if tuple(t.shape) != (spec.num_blocks, h, bs, 2 * d):
        raise ValueError(f"KvblocksConnector: the KV tensor is {tuple(t.shape)}, not [blocks, heads, block_size, "
                         f"2 * head_size] = {(spec.num_blocks, h, bs, 2 * d)} as vLLM's CPU backend (LBHNC) "
                         "makes it: this vLLM lays blocks out another way")


class _WorkerSide:
    """One worker's kvblocks engine. Prefill: the registered KV cache, the held requests and the notices
    that release them. Decode: peers, pulls in flight (async handles) and one control thread that links
    and sends notices, so that neither ever blocks a model step."""

    def __init__(self, c: KvblocksConnector):
        self.c = c
        o = c._opts
        role = {"kv_producer": kb.LlmRole.PROMPT, "kv_consumer": kb.LlmRole.DECODER}.get(c._kv_role, kb.LlmRole.MIX)
        # this worker's tensor-parallel rank (the stand-in connectors of the worker tests set none: TP 1)
        self.tp, self.rank = int(getattr(c, "_tp", 1)), int(getattr(c, "_rank", 0))
        self.rank_id = rank_engine_id(c._engine_id, self.tp, self.rank)
        self.dd = kb.LlmDataDist(cluster_id_of(self.rank_id), role)
        opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: str(o.pull_timeout_ms),
                kb.OPTION_TRANSPORT: o.transport}
        if o.auth_token:
            opts[kb.OPTION_AUTH_TOKEN] = o.auth_token
        if c._is_producer:
            host, port = o.listen  # type: ignore[misc]
            opts[kb.OPTION_LISTEN_IP_INFO] = "%s:%d" % (host, port + self.rank)
        self.dd.initialize(opts)
        self.reg: Optional[layouts.Registration] = None
        self.layout: Optional[layouts.Layout] = None
        self._lock = threading.Lock()
        # prefill: held requests (released by the ticket holder's notices, or by the lease)
        # decode, mode push: the same bookkeeping holds our reserved blocks for the prefill holding the
        # transfer's ticket (its done releases them to vLLM)
        self.holder = notices.Holder(max_lease_s=max(o.abort_timeout_s, self._push_lease_s(o)))
        self.reservations = notices.Reservations() if c._is_producer else None
        self._inbox = notices.Inbox(self.dd, self.holder, log=lambda m: logger.warning("KvblocksConnector: %s", m),
                                    reservations=self.reservations)
        self._layer_of: Dict[str, int] = {}
        self._pushes_opened = False  # prefill: this step's pushes are open (until wait_for_save)
        self._open_pushes: List[Tuple[_PushJob, notices.Notice, int, "kb.LayerPush"]] = []
        self._push_recv: Dict[str, _RecvJob] = {}  # decode: xfer -> the job whose blocks wait for a push
        self._refused_holds: Set[str] = set()
        # decode
        self.peers = Peers(self.dd, link_timeout_ms=o.link_timeout_ms)
        self._pulls: Transfers[Tuple[_RecvJob, _Group]] = Transfers()
        self._recv_done: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._load_errors_out: Set[int] = set()
        self._control: "queue.Queue[Optional[Tuple[str, Any]]]" = queue.Queue()
        self._control_thread: Optional[threading.Thread] = None
        if c._is_consumer:
            self._control_thread = threading.Thread(target=self._control_loop, name="kvblocks-vllm-control",
                                                    daemon=True)
            self._control_thread.start()
        self.pull_seconds: List[float] = []  # per successful pull, for stats and tests
        self._stats = KvblocksConnectorStats()  # this interval's (under _lock)
        self._engine_delta = EngineDelta()
        self._stats_polled = 0.0  # when the engine's counters were last read

    # -------------------------------------------------------------- setup

    def register(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        if self.reg is not None:
            raise RuntimeError("KvblocksConnector: register_kv_caches called twice")
        try:
            from vllm.model_executor.models.utils import extract_layer_index
            names = sorted(kv_caches, key=lambda n: (extract_layer_index(n), n))
        except Exception:  # noqa: BLE001 - any naming scheme: keep vLLM's order
            names = list(kv_caches)
        tensors = [kv_caches[n] for n in names]
        try:
            lay, addrs = layouts.describe_arrays(tensors)
        except ValueError as e:
            raise ValueError(f"KvblocksConnector: KV caches {names[0]}..{names[-1]}: {e}") from None
        spec = self.c._layout
        if spec is not None:
            if lay.num_blocks != spec.num_blocks or lay.block_bytes != spec.block_bytes:
                raise ValueError(f"KvblocksConnector: a KV tensor is {lay.num_blocks} blocks of {lay.block_bytes} "
                                 f"bytes, the KV cache spec says {spec.num_blocks} of {spec.block_bytes}: a block "
                                 "of a layer must be one contiguous chunk")
            if layouts.geometry(spec) is not None:
                _check_interior(spec, tensors[0])
            lay = spec
        self.reg = layouts.register(self.dd, lay, addrs, _cache_key(self.rank_id), keepalive=tensors)
        self._layer_of = {n: i for i, n in enumerate(names)}
        self.layout = lay
        logger.info("KvblocksConnector: registered %d layers x %d blocks of %d bytes (%s, role %s, TP rank %d "
                    "of %d)", lay.num_layers, lay.num_blocks, lay.block_bytes, lay.dtype, self.c._kv_role,
                    self.rank, self.tp)

    # -------------------------------------------------------------- per step

    @staticmethod
    def _push_lease_s(o: _Options) -> float:
        """How long a decode keeps blocks reserved for a push: the prefill must first get the request."""
        return o.link_timeout_ms / 1000 + o.pull_timeout_ms / 1000 + 30

    def start(self, meta: KvblocksConnectorMetadata) -> None:
        for rid, (lease, ticket) in meta.reqs_to_send.items():
            if not self.holder.hold(rid, ticket, lease):
                self._refused_holds.add(rid)  # too many held: free at once, the decode recomputes
        for job in meta.reqs_to_recv.values():
            self._start_pull(job)

    def finished(self) -> Tuple[Set[str], Set[str]]:
        self._inbox.poll()
        released, expired = self.holder.finished()
        sending: Set[str] = set()
        if self.c._is_producer:
            for rid in expired:
                logger.warning("KvblocksConnector: request %s: no decode pulled its blocks within "
                               "abort_timeout_s=%s; freeing them", rid, self.c._opts.abort_timeout_s)
            sending = released | expired | self._refused_holds
            self._refused_holds = set()
        else:
            self._pushed(released, expired)  # a decode's holds are its reserved blocks (mode push)
        for f in self._pulls.poll():
            job, grp = f.context
            grp.remaining -= 1  # one transfer of the request's pull
            grp.error = grp.error or f.error
            if grp.remaining > 0:
                continue
            self._pull_finished(job, grp.error is None, f.seconds, grp.error)
        with self._lock:
            recving, self._recv_done = self._recv_done, set()
            self._load_errors_out |= self._load_errors
            self._load_errors = set()
        return sending, recving

    def take_stats(self) -> Optional[KvblocksConnectorStats]:
        """The interval's stats, with the engine's counter growth read after a pull or once a second
        (the model runner asks every step; a snapshot costs microseconds, not nothing)."""
        with self._lock:
            now = time.monotonic()
            if self._stats.data["pull_duration"] or self._stats.data["num_failed_pulls"] or \
                    now - self._stats_polled >= 1.0:
                self._stats_polled = now
                self._stats.record_engine(self._engine_delta.take(self.dd.metrics()))
            return None if self._stats.is_empty() else self._stats.clone_and_reset()

    def take_load_errors(self) -> Set[int]:
        with self._lock:
            out, self._load_errors_out = self._load_errors_out, set()
        return out

    # -------------------------------------------------------------- pulls (decode)

    # -------------------------------------------------------------- layer-wise push

    def _pushed(self, released: Set[str], expired: Set[str]) -> None:
        """Decode, mode push: the holds the prefill released (done) or that ran out are the transfer ids of
        our reserved blocks, not prefill requests: report them as received (or failed)."""
        for xfer in released | expired:
            job = self._push_recv.pop(xfer, None)
            if job is None:
                continue
            if xfer in released and self.holder.released_by(xfer) == "done":
                took = time.perf_counter() - job.t0
                assert self.layout is not None
                with self._lock:
                    self.pull_seconds.append(took)
                    self._stats.record_pull(took, len(job.local_block_ids) * self.layout.block_bytes
                                            * self.layout.num_layers)
                    self._recv_done.add(job.req_id)
            else:
                self._fail(job, "the prefill aborted the push" if xfer in released
                           else "no push landed within the reservation's lease", tell=False)

    def _start_push_recv(self, job: _RecvJob, p: Peer) -> None:
        """Decode, mode push: hold our blocks for the prefill and tell it where to push (control thread)."""
        xfer = str(job.params[PARAMS_KEY].get("xfer"))
        ticket = notices.new_ticket()
        if not self.holder.hold(xfer, ticket, self._push_lease_s(self.c._opts)):
            return self._fail(job, "too many reserved transfers")
        self._push_recv[xfer] = job
        self._control.put(("reserve", (p, job, ticket)))

    def _reserve(self, p: Peer, job: _RecvJob, ticket: str) -> None:
        self._ready(p, job.params[PARAMS_KEY])
        dst = job.local_block_ids
        mode = self.c._opts.test_reverse_blocks
        if mode == "all" or (mode == "per_request" and job.params.get("_test_reverse_blocks")):
            dst = dst[::-1]  # tests only: a deliberately wrong mapping
        notices.send_reserve(self.dd, p.cluster_id, str(job.params[PARAMS_KEY]["xfer"]), ticket, dst,
                             job.push_offset, timeout_ms=self.c._opts.link_timeout_ms)

    def layer_computed(self, layer_name: str, pushes: Dict[str, _PushJob]) -> None:
        """Prefill, mode push: layer ``layer_name`` of this step is in the KV cache."""
        layer = self._layer_of.get(layer_name)
        if layer is None:
            return
        if not self._pushes_opened:
            self._pushes_opened = True
            self._open_step_pushes(pushes)
        for _, _, _, lp in self._open_pushes:
            lp.layer_ready(layer)

    def _open_step_pushes(self, pushes: Dict[str, _PushJob]) -> None:
        for rid, job in pushes.items():
            dec = cluster_id_of(job.decode_engine_id)
            res = self._reservation(job.xfer, dec)
            if res is None:
                logger.warning("KvblocksConnector: request %s: decode %s reserved no blocks for transfer %s "
                               "in time; not pushed", rid, job.decode_engine_id, job.xfer)
                continue
            src = job.block_ids[res.offset:res.offset + len(res.blocks)]
            try:
                if len(src) != len(res.blocks):
                    raise ValueError(f"{len(res.blocks)} reserved blocks from {res.offset} for {len(job.block_ids)}")
                assert self.reg is not None
                cid = self.dd._find_remote_cache(dec, _cache_key(job.decode_engine_id))
                lp = self.dd.open_layer_push(self.reg.cache, kb.CacheIndex(dec, cid), src, list(res.blocks),
                                             tensor_num_per_layer=1)
            except Exception as e:  # noqa: BLE001 - the decode's lease runs out and it recomputes
                logger.warning("KvblocksConnector: request %s: layer-wise push to %s failed to open (%s: %s)",
                               rid, job.decode_engine_id, type(e).__name__, e)
                self._tell(dec, "abort", res)
                continue
            self._open_pushes.append((job, res, dec, lp))

    def _reservation(self, xfer: str, dec: int) -> Optional[notices.Notice]:
        """The decode's reserve notice for ``xfer``; it may still be on its way (the client sent the
        request to both at once): poll the notifications a little, bounded by link_timeout_ms."""
        assert self.reservations is not None
        end = time.monotonic() + self.c._opts.link_timeout_ms / 1000
        while True:
            res = self.reservations.take(xfer, dec)
            if res is not None or time.monotonic() >= end:
                return res
            self._inbox.poll()
            time.sleep(0.0005)

    def finish_pushes(self) -> None:
        """Prefill, mode push: wait for this step's pushes and tell each decode done or abort."""
        for job, res, dec, lp in self._open_pushes:
            ok = True
            try:
                lp.finish(self.c._opts.pull_timeout_ms / 1000)
            except Exception as e:  # noqa: BLE001
                ok = False
                logger.warning("KvblocksConnector: layer-wise push of %s to %s failed (%s: %s)", job.xfer,
                               job.decode_engine_id, type(e).__name__, e)
            self._tell(dec, "done" if ok else "abort", res)
        self._open_pushes = []
        self._pushes_opened = False

    def _tell(self, dec: int, kind: str, res: notices.Notice) -> None:
        try:
            notices.send(self.dd, dec, kind, res.rid, res.ticket, timeout_ms=self.c._opts.link_timeout_ms)
        except Exception as e:  # noqa: BLE001 - the decode's lease frees its blocks
            logger.debug("KvblocksConnector: could not tell decode %d %s for %s: %s", dec, kind, res.rid, e)

    # -------------------------------------------------------------- pulls (decode)

    def _start_pull(self, job: _RecvJob) -> None:
        """Submit the pull now when the prefill ranks' links are up (the common case: no thread hop),
        else hand it to the control thread, which links first."""
        job.t0 = time.perf_counter()
        try:
            job.sources = self._sources_of(job)
        except (ValueError, KeyError, TypeError) as e:
            return self._fail(job, e)
        if not job.report:
            self._tell_all(job, "abort")  # the decode gave up before pulling
            return
        if job.push_offset >= 0:
            if self.c._is_producer:  # kv_both: one notice table serves the prefill's holds
                return self._fail(job, "layer-wise push needs kv_consumer (this instance is kv_both)")
            if len(job.sources) != 1 or self.tp != 1:
                return self._fail(job, "layer-wise push needs tensor parallelism 1 on both sides")
            return self._start_push_recv(job, job.sources[0][0])
        if all(self.peers.is_up(p) and _cache_key(p.engine_id) in p.caches for p, _ in job.sources):
            try:
                return self._submit(job)
            except Exception as e:  # noqa: BLE001 - e.g. the link broke meanwhile: relink on the control thread
                for p, _ in job.sources:
                    self.peers.mark_broken(p)
                logger.debug("KvblocksConnector: request %s: submitting failed (%s); linking again", job.req_id, e)
        self._control.put(("pull", (job,)))

    def _sources_of(self, job: _RecvJob) -> List[Tuple[Peer, layouts.RankSource]]:
        """The prefill ranks this worker pulls the request from, with the heads it takes from each: the
        prefill's rank r holds KV heads [r h, (r + 1) h) (h: its layout's heads per rank), ours too.
        Raises ValueError (KeyError, TypeError) for params that do not say where or what."""
        info = job.params[PARAMS_KEY]
        engine_id, host, port = str(info["engine_id"]), str(info["host"]), int(info["port"])
        check_id(str(info.get("request_id")))
        their_tp = int(info.get("tp_size", 1))
        if not 0 < their_tp <= notices.MAX_PULLERS:
            raise ValueError(f"prefill tp_size {their_tp} outside 1..{notices.MAX_PULLERS}")
        listed = info.get("rank_ports") or [port]
        if not isinstance(listed, list):
            raise ValueError(f"prefill rank_ports must be a list, got {type(listed).__name__}")
        ports = [int(x) for x in listed]
        if len(ports) != their_tp:
            raise ValueError(f"prefill tp_size {their_tp} with {len(ports)} rank ports")
        swap = _test_mode(self.c._opts.test_swap_ranks, job.params, "_test_swap_ranks")
        ours = self.tp
        if their_tp == ours and not swap:
            ranks = [layouts.RankSource(self.rank, None, 1)]
        else:
            assert self.layout is not None
            theirs = layouts.Layout.from_dict(info["layout"]) if info.get("layout") else self.layout
            gs, gd = layouts.geometry(theirs), layouts.geometry(self.layout)
            if gs is None or gd is None:
                raise ValueError(f"tensor parallelism: ours {ours}, the prefill's {their_tp}: a head slice needs "
                                 f"both sides to describe their block interior, one of {sorted(layouts.INTERIORS)}")
            ranks = layouts.tp_sources(their_tp, gs.heads, ours, self.rank, gd.heads, swap=swap)
        return [(self.peers.get(rank_engine_id(engine_id, their_tp, rs.rank), host, ports[rs.rank]), rs)
                for rs in ranks]

    def _ready(self, p: Peer, info: Dict[str, Any], head_maps: Optional[Sequence[layouts.HeadMap]] = None) -> None:
        """Link (once, or again after a failure) and check the prefill rank's layout against ours: the one
        its params claim, field by field (taking ``head_maps`` of its heads), and the cache its link
        announced."""
        assert self.layout is not None
        # push params come from the client: the prefill's cache (as its link announced it) is checked
        theirs = layouts.Layout.from_dict(info["layout"]) if info.get("layout") or not _is_push(info) \
            else self.layout
        compat = layouts.compatible(self.layout, theirs, head_maps)
        if not compat.ok:
            raise ValueError(f"KV layout of prefill {p.engine_id} cannot be moved into ours: {compat.explain()}")
        fresh = not self.peers.is_up(p)
        self.peers.ensure_linked(p)
        key = _cache_key(p.engine_id)
        if fresh or key not in p.caches:
            p.caches.pop(key, None)
            described = self.peers.describe_cache(p, self.peers.find_cache(p, key))
            diffs = layouts.check_remote_cache(theirs, described)
            if diffs:
                p.caches.pop(key, None)
                raise ValueError(f"prefill {p.engine_id}'s registered KV cache does not match its params: "
                                 f"{layouts.explain(diffs)}")
            logger.info("KvblocksConnector: linked to prefill %s at %s:%d (%s)", p.engine_id, p.host, p.port,
                        self.dd.link_path(p.cluster_id))

    def _submit(self, job: _RecvJob) -> None:
        """Prepare (check) the pull from every source rank first, then submit them all; the request
        finishes when the last transfer does."""
        assert self.reg is not None and self.layout is not None
        src, dst = job.remote_block_ids, job.local_block_ids
        info = job.params[PARAMS_KEY]
        theirs = layouts.Layout.from_dict(info["layout"]) if info.get("layout") else self.layout
        if _test_mode(self.c._opts.test_reverse_blocks, job.params, "_test_reverse_blocks"):
            dst = dst[::-1]  # tests only: a deliberately wrong mapping
        starts: List[Any] = []  # callables submitting one transfer each (a handle)
        job.bytes = 0
        for p, rs in job.sources:
            compat = layouts.compatible(self.layout, theirs, rs.head_maps)
            if not compat.ok:
                raise ValueError(f"KV layout of prefill {p.engine_id} cannot be moved into ours: {compat.explain()}")
            if not src or job.num_tokens <= job.dst_token0 and not compat.same:
                continue
            idx = kb.CacheIndex(p.cluster_id, p.caches[_cache_key(p.engine_id)])
            if compat.same and rs.head_maps is None:
                if len(src) != len(dst):
                    raise ValueError(f"request {job.req_id}: {len(src)} remote blocks for {len(dst)} local ones")
                job.bytes += len(src) * self.layout.block_bytes * self.layout.num_layers
                starts.append(lambda idx=idx, cache=self.reg.cache: self.dd.pull_kv_blocks_async(idx, cache, src, dst))
            else:
                for x in self._plan_transform(job, idx, compat, theirs, rs.head_maps, src, dst):
                    job.bytes += x.bytes
                    starts.append(x.execute_async)
        if not starts:
            return self._pull_finished(job, True, 0.0, None)
        grp = _Group(len(starts))
        for k, start in enumerate(starts):
            try:
                handle = start()
            except Exception as e:  # noqa: BLE001 - those in flight finish first, then the request fails
                grp.remaining, grp.error = k, f"{type(e).__name__}: {e}"
                if k == 0:
                    raise
                return
            self._pulls.add((job.req_id, k), handle, (job, grp), job.t0)

    def _plan_transform(self, job: _RecvJob, idx: "kb.CacheIndex", compat: layouts.Compat, theirs: layouts.Layout,
                        head_maps: Optional[Sequence[layouts.HeadMap]], src: List[int], dst: List[int]) -> List[Any]:
        """The prepared (checked) transfers of a pull between unequal layouts: block sizes, and the KV
        heads ``head_maps`` take from this prefill rank."""
        assert self.reg is not None and self.layout is not None
        gs, gd = compat.src or layouts.geometry(theirs), compat.dst or layouts.geometry(self.layout)
        if gs is None or gd is None:
            raise ValueError("a head slice needs both sides to describe their block interior")
        maps = list(head_maps) if head_maps is not None else None
        if _test_mode(self.c._opts.test_rotate_heads, job.params, "_test_rotate_heads") and gs.heads > 1:
            maps = [(1, 0, gs.heads - 1), (0, gs.heads - 1, 1)]  # tests only: heads rotated by one
        pieces = layouts.plan(gs, gd, src, dst, job.dst_token0, job.num_tokens, job.src_token0,
                              job.dst_token0, maps, sink=NULL_BLOCK)
        return [self.dd.prepare_transfer(idx, self.reg.cache, list(pc.src_blocks), list(pc.dst_blocks),
                                         src_layout=pc.src_layout, dst_layout=pc.dst_layout,
                                         src_heads=pc.src_heads, dst_heads=pc.dst_heads) for pc in pieces]

    def _pull_finished(self, job: _RecvJob, ok: bool, took: float, error: Optional[str]) -> None:
        if not ok:
            return self._fail(job, error)
        assert self.layout is not None
        with self._lock:
            self.pull_seconds.append(took)
            self._stats.record_pull(took, job.bytes)
            self._recv_done.add(job.req_id)
        self._tell_all(job, "done")

    def _tell_all(self, job: _RecvJob, kind: str) -> None:
        """Tell every prefill rank we pull from (on the control thread), each with how many of our ranks
        pull from it: it frees the blocks after that many notices."""
        for p, rs in job.sources:
            self._control.put(("notice", (p, job, kind, rs.pullers)))

    def _fail(self, job: _RecvJob, e: Any, tell: bool = True) -> None:
        """Any failure: report the blocks (vLLM recomputes them) and, with ``tell``, tell the prefill
        ranks we gave up."""
        if tell and job.report:
            for p, _ in job.sources:
                self.peers.mark_broken(p)
        logger.warning("KvblocksConnector: request %s: pulling %d blocks from %s failed (%s); vLLM will "
                       "recompute them", job.req_id, len(job.local_block_ids),
                       job.params.get(PARAMS_KEY, {}).get("engine_id"), e)
        with self._lock:
            if job.report:
                self._load_errors.update(job.local_block_ids)
                self._stats.record_failed_pull()
                self._recv_done.add(job.req_id)
        if tell:
            for p, rs in job.sources:
                if self.peers.is_up(p):
                    self._control.put(("notice", (p, job, "abort", rs.pullers)))

    # -------------------------------------------------------------- control thread (decode)

    def _control_loop(self) -> None:
        """Links and notices: the only blocking calls, off the model runner's thread."""
        while True:
            item = self._control.get()
            if item is None:
                return
            what, args = item
            if what in ("pull", "reserve"):
                job = args[0] if what == "pull" else args[1]
                try:
                    if what == "pull":
                        for p, rs in job.sources:
                            self._ready(p, job.params[PARAMS_KEY], rs.head_maps)
                        self._submit(job)
                    else:
                        self._reserve(*args)
                except Exception as e:  # noqa: BLE001 - any failure: vLLM recomputes
                    if what == "reserve":
                        self._push_recv.pop(str(job.params[PARAMS_KEY].get("xfer")), None)
                    self._fail(job, f"{type(e).__name__}: {e}")
            else:
                self._notify(*args)

    def _notify(self, p: Peer, job: _RecvJob, kind: str, pullers: int = 1) -> None:
        info = job.params.get(PARAMS_KEY, {})
        ticket, rid = info.get("ticket"), info.get("request_id")
        if not isinstance(ticket, str) or not isinstance(rid, str):
            return
        try:
            if kind == "abort" and not self.peers.is_up(p):
                return  # never linked: its lease frees the blocks
            notices.send(self.dd, p.cluster_id, kind, rid, ticket, timeout_ms=self.c._opts.link_timeout_ms,
                         pullers=pullers)
        except Exception as e:  # noqa: BLE001 - its lease frees the blocks instead
            logger.debug("KvblocksConnector: could not tell prefill %s %s for %s: %s", p.engine_id, kind, rid, e)

    def shutdown(self) -> None:
        self._control.put(None)
        if self._control_thread is not None:
            self._control_thread.join(timeout=5)
        self.peers.close()
        try:
            self.dd.finalize()
        except Exception:  # noqa: BLE001
            pass
