# SPDX-License-Identifier: Apache-2.0
"""``KvblocksConnector``: vLLM disaggregated prefill/decode over kvblocks, in the pull model of NixlConnector.

Flow (one request):

1. The client (or a proxy) sends the prompt to the **prefill** instance with
   ``kv_transfer_params={"do_remote_decode": True}`` and ``max_tokens=1``. When it finishes, the prefill
   scheduler's :meth:`KvblocksConnector.request_finished` keeps the request's blocks (delayed free) and
   returns ``kv_transfer_params``: engine id, kvblocks address and side-channel port, kvblocks cluster id,
   block ids, number of computed tokens and a layout hash.
2. The client sends the same prompt with those params to the **decode** instance. Its scheduler's
   :meth:`get_num_new_matched_tokens` answers ``(n, True)`` (n tokens will be loaded asynchronously),
   :meth:`update_state_after_alloc` records the local blocks vLLM allocated for them, and
   :meth:`build_connector_meta` hands the (remote blocks -> local blocks) job to the worker.
3. The decode worker's :meth:`start_load_kv` queues the job on a thread that links to the prefill (once
   per peer, lazily, checking the layout), claims the request over the side channel (the prefill binds
   it to this decode and refuses it to any other), pulls the blocks of every layer with one
   ``LlmDataDist.pull_kv_blocks`` call, and tells the prefill over the side channel that it is done.
   :meth:`get_finished` reports the request as received; failed blocks go to
   :meth:`get_block_ids_with_load_errors` so that vLLM recomputes them (use
   ``kv_load_failure_policy="recompute"`` on the decode instance).
4. The prefill worker's :meth:`get_finished` reports the request as sent (its blocks are freed) once the
   decode it was handed to said done, or when the lease (``abort_timeout_s``) expires.

The KV cache must be host memory (vLLM's CPU backend): kvblocks moves host memory. Tensor parallelism 1
only; no layer-wise push (the pull happens after the whole prefill).

Options (``kv_connector_extra_config``):

==================== ========================================================================================
``listen``           ``ip:port`` of the prefill's kvblocks listener (kv_producer and kv_both; required there)
``advertise_host``   the host decode instances use to reach this prefill (default: the ``listen`` ip; needed
                     when listening on ``0.0.0.0``)
``notify_port``      the side-channel port (default: the ``listen`` port + 1)
``transport``        ``auto`` (default: shared memory on one host, TCP between hosts), ``tcp``, ``shm``
``auth_token``       shared secret for kvblocks links and the side channel (default: ``KVBLOCKS_AUTH_TOKEN``)
``pull_timeout_ms``  deadline of one pull (``llm.SyncKvCacheWaitTime``), default 5000
``link_timeout_ms``  deadline of linking to a prefill and of side-channel answers, default 3000
``abort_timeout_s``  lease: the prefill frees a request's blocks after this long even without a "done",
                     default 120
``pull_threads``     concurrent pulls on a decode worker, default 2
==================== ========================================================================================
"""
import hashlib
import json
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvblocks as kb
from kvblocks.vllm._sidechannel import Handoffs, Refused, SideChannelClient, SideChannelServer
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

PARAMS_KEY = "kvblocks"  # kv_transfer_params["kvblocks"] holds our fields (besides Nixl-style generic ones)

_DTYPES = {
    torch.bfloat16: kb.DataType.DT_BF16,
    torch.float16: kb.DataType.DT_FLOAT16,
    torch.float32: kb.DataType.DT_FLOAT,
    torch.uint8: kb.DataType.DT_UINT8,
    torch.int8: kb.DataType.DT_INT8,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = kb.DataType.DT_UINT8  # moved as bytes


@dataclass
class _Options:
    """Parsed ``kv_connector_extra_config``."""

    listen: Optional[Tuple[str, int]]
    advertise_host: Optional[str]
    notify_port: Optional[int]
    transport: str
    auth_token: Optional[str]
    pull_timeout_ms: int
    link_timeout_ms: int
    abort_timeout_s: float
    pull_threads: int
    test_reverse_blocks: str  # "off", "all", "per_request"

    @classmethod
    def parse(cls, extra: Dict[str, Any]) -> "_Options":
        known = {"listen", "advertise_host", "notify_port", "transport", "auth_token", "pull_timeout_ms",
                 "link_timeout_ms", "abort_timeout_s", "pull_threads", "_test_reverse_blocks"}
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
        notify = extra.get("notify_port")
        return cls(
            listen=listen,
            advertise_host=extra.get("advertise_host"),
            notify_port=int(notify) if notify is not None else (listen[1] + 1 if listen else None),
            transport=transport,
            auth_token=extra.get("auth_token") or os.environ.get("KVBLOCKS_AUTH_TOKEN") or None,
            pull_timeout_ms=int(extra.get("pull_timeout_ms", 5000)),
            link_timeout_ms=int(extra.get("link_timeout_ms", 3000)),
            abort_timeout_s=float(extra.get("abort_timeout_s", 120)),
            pull_threads=max(1, int(extra.get("pull_threads", 2))),
            test_reverse_blocks=_reverse_mode(extra.get("_test_reverse_blocks", False)),
        )


def _reverse_mode(v: Any) -> str:
    """Tests only: ``_test_reverse_blocks`` true pulls every request's blocks in reverse order (a wrong
    mapping the output must show); ``"per_request"`` only for requests whose kv_transfer_params say
    ``"_test_reverse_blocks": true``."""
    if v == "per_request":
        return v
    return "all" if v in (True, "true", "1", 1) else "off"


def layout_of(kv_cache_config: "KVCacheConfig") -> Dict[str, Any]:
    """What both sides must agree on: per group the spec kind, block size, heads, head size, dtype, page
    bytes and number of layers (one kvblocks tensor per layer)."""
    groups = []
    for g in kv_cache_config.kv_cache_groups:
        s = g.kv_cache_spec
        groups.append({
            "spec": type(s).__name__,
            "block_size": s.block_size,
            "num_kv_heads": getattr(s, "num_kv_heads", None),
            "head_size": getattr(s, "head_size", None),
            "dtype": str(getattr(s, "dtype", None)),
            "page_size_bytes": s.page_size_bytes,
            "layers": len(g.layer_names),
        })
    return {"groups": groups, "num_tensors": sum(g["layers"] for g in groups), "tp": 1}


def layout_hash(kv_cache_config: "KVCacheConfig") -> str:
    """A short hash of :func:`layout_of`, compared before linking."""
    return hashlib.sha256(json.dumps(layout_of(kv_cache_config), sort_keys=True).encode()).hexdigest()[:16]


def cluster_id_of(engine_id: str) -> int:
    """The kvblocks cluster id of an engine: 56 bits of the engine id's SHA-256 (stable across processes)."""
    return int.from_bytes(hashlib.sha256(engine_id.encode()).digest()[:7], "big") or 1


@dataclass
class _RecvJob:
    """One request's pull: remote blocks -> local blocks, and whom to notify."""

    req_id: str
    local_block_ids: List[int]
    remote_block_ids: List[int]
    params: Dict[str, Any]
    report: bool = True  # False: only notify the prefill (no local blocks wait for it)


@dataclass
class KvblocksConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, once per step.

    Attributes:
        reqs_to_recv: decode side, the pulls to start this step.
        reqs_to_send: prefill side, requests whose blocks wait for a pull: id -> lease in seconds.
    """

    reqs_to_recv: Dict[str, _RecvJob] = field(default_factory=dict)
    reqs_to_send: Dict[str, float] = field(default_factory=dict)


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
        if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
            raise NotImplementedError("KvblocksConnector supports tensor_parallel_size=1 and "
                                      "pipeline_parallel_size=1 only")
        self._block_size = vllm_config.cache_config.block_size
        self._layout_hash = layout_hash(kv_cache_config) if kv_cache_config is not None else None
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
        ``l`` seen as ``[num_blocks, page bytes]``, so one pull moves a block of every layer. Producers
        then serve the side channel."""
        assert self._worker is not None
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        """Queue this step's pulls (decode) on the pull threads and record the prefill's pending sends;
        returns at once (loads are asynchronous: vLLM waits via :meth:`get_finished`)."""
        assert self._worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvblocksConnectorMetadata)
        self._worker.start(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: loads are whole-request and asynchronous (the request only runs once its
        pull is reported finished), not layer by layer."""
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        """Nothing to save: the decode pulls from the prefill's own paged cache (no layer-wise push)."""
        return

    def wait_for_save(self) -> None:
        """Nothing to wait for: there are no saves (see :meth:`save_kv_layer`)."""
        return

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
        """Stop the pull threads and the side channel, release the kvblocks engine."""
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
        return self._sched.build_meta()

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
        self._send: Dict[str, float] = {}
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
        remote_tokens = int(params[PARAMS_KEY].get("num_tokens", 0))
        count = min(remote_tokens, request.num_prompt_tokens) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
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
            job = _RecvJob(request.request_id, local, remote[hashed:n_blocks], dict(params))
        else:
            job = _RecvJob(request.request_id, [], [], dict(params), report=False)  # full local hit
        self._recv[request.request_id] = job
        params["do_remote_prefill"] = False  # one transfer per request

    def build_meta(self) -> KvblocksConnectorMetadata:
        meta = KvblocksConnectorMetadata(reqs_to_recv=self._recv, reqs_to_send=self._send)
        self._recv, self._send = {}, {}
        return meta

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
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED):
            return False, None  # aborted: nothing to hand off
        n_tokens = request.num_computed_tokens
        n_blocks = (n_tokens + self.c._block_size - 1) // self.c._block_size
        blocks = list(block_ids[:n_blocks])
        if not blocks:
            return False, None
        self._send[request.request_id] = self.c._opts.abort_timeout_s
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
                "notify_port": self.c._opts.notify_port,
                "cluster_id": cluster_id_of(self.c._engine_id),
                "block_ids": blocks,
                "num_tokens": n_tokens,
                "layout_hash": self.c._layout_hash,
            },
        }


# ====================================================================== worker side


def _peer_key(info: Dict[str, Any]) -> Tuple[str, str, int, int]:
    """A prefill is its engine id at its addresses: params naming a known engine id with other addresses
    make another peer (which must prove that engine id itself), never redirect the known one."""
    return str(info["engine_id"]), str(info["host"]), int(info["port"]), int(info["notify_port"])


class _Peer:
    """A prefill instance this decode worker pulls from: side channel + kvblocks link, set up lazily."""

    def __init__(self, info: Dict[str, Any], opts: _Options, my_engine_id: str):
        self.engine_id, self.host, self.port, notify_port = _peer_key(info)
        self.chan = SideChannelClient(self.host, notify_port, opts.auth_token, timeout_s=opts.link_timeout_ms / 1000,
                                      engine_id=my_engine_id, peer_engine=self.engine_id)
        self.lock = threading.Lock()
        self.linked = False
        self.broken = False
        self.cluster_id = 0
        self.cache_id = 0

    def cluster(self) -> "kb.ClusterInfo":
        return kb.ClusterInfo(self.cluster_id, 0, [kb.IpInfo(self.chan.local_ip, 0)], [kb.IpInfo(self.host, self.port)])


class _WorkerSide:
    def __init__(self, c: KvblocksConnector):
        self.c = c
        o = c._opts
        self._cluster_id = cluster_id_of(c._engine_id)
        role = {"kv_producer": kb.LlmRole.PROMPT, "kv_consumer": kb.LlmRole.DECODER}.get(c._kv_role, kb.LlmRole.MIX)
        self.dd = kb.LlmDataDist(self._cluster_id, role)
        opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: str(o.pull_timeout_ms),
                kb.OPTION_TRANSPORT: o.transport}
        if o.auth_token:
            opts[kb.OPTION_AUTH_TOKEN] = o.auth_token
        if c._is_producer:
            opts[kb.OPTION_LISTEN_IP_INFO] = "%s:%d" % o.listen  # type: ignore[str-format]
        self.dd.initialize(opts)
        self.cache: Optional[kb.Cache] = None
        self._tensors: List[torch.Tensor] = []  # keep vLLM's tensors alive while registered
        self._server: Optional[SideChannelServer] = None
        self._lock = threading.Lock()
        # prefill: held requests, the decode each was handed to, "done" notices (bounded)
        self._handoffs = Handoffs(retention_s=2 * o.abort_timeout_s + 60)
        # decode
        self._peers: Dict[Tuple[str, str, int, int], _Peer] = {}
        self._peers_lock = threading.Lock()
        self._recv_done: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._load_errors_out: Set[int] = set()
        self._pool = ThreadPoolExecutor(max_workers=o.pull_threads, thread_name_prefix="kvblocks-vllm-pull") \
            if c._is_consumer else None
        self._notify_q: "queue.Queue[Optional[Tuple[_Peer, str]]]" = queue.Queue()
        if c._is_consumer:
            threading.Thread(target=self._notify_loop, name="kvblocks-vllm-done", daemon=True).start()
        self.layout: Dict[str, Any] = {}
        self.pull_seconds: List[float] = []  # per successful pull, for stats and tests
        self._stats = KvblocksConnectorStats()  # this interval's (under _lock)
        self._engine_delta = EngineDelta()
        self._stats_polled = 0.0  # when the engine's counters were last read

    # -------------------------------------------------------------- setup

    def register(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        if self.cache is not None:
            raise RuntimeError("KvblocksConnector: register_kv_caches called twice")
        try:
            from vllm.model_executor.models.utils import extract_layer_index
            names = sorted(kv_caches, key=lambda n: (extract_layer_index(n), n))
        except Exception:  # noqa: BLE001 - any naming scheme: keep vLLM's order
            names = list(kv_caches)
        tensors = [kv_caches[n] for n in names]
        t0 = tensors[0]
        kcc = self.c._kv_cache_config
        num_blocks = kcc.num_blocks if kcc is not None else t0.shape[0]
        for n, t in zip(names, tensors):
            if t.device.type != "cpu":
                raise NotImplementedError(f"KvblocksConnector: KV cache {n} is on {t.device}; kvblocks moves host "
                                          "memory only (use vLLM's CPU backend)")
            if t.shape != t0.shape or t.dtype != t0.dtype:
                raise ValueError(f"KvblocksConnector: layers differ: {n} is {tuple(t.shape)} {t.dtype}, "
                                 f"{names[0]} is {tuple(t0.shape)} {t0.dtype}")
            if not t.is_contiguous() or t.shape[0] != num_blocks:
                raise ValueError(f"KvblocksConnector: KV cache {n} {tuple(t.shape)} strides {t.stride()} is not "
                                 f"[num_blocks={num_blocks}, ...] contiguous: a block of a layer must be one chunk")
        if t0.dtype not in _DTYPES:
            raise ValueError(f"KvblocksConnector: unsupported KV cache dtype {t0.dtype}")
        per_block = t0[0].numel()
        block_bytes = per_block * t0.element_size()
        if kcc is not None:
            page = kcc.kv_cache_groups[0].kv_cache_spec.page_size_bytes
            if page != block_bytes:
                raise ValueError(f"KvblocksConnector: a block of {names[0]} is {block_bytes} bytes, the KV cache spec "
                                 f"says {page}")
        desc = kb.CacheDesc(num_tensors=len(tensors), data_type=_DTYPES[t0.dtype], shape=[num_blocks, per_block])
        self.cache = self.dd.register_kv_cache(desc, [t.data_ptr() for t in tensors])
        self._tensors = tensors
        self.layout = {"num_tensors": len(tensors), "block_bytes": block_bytes, "dtype": str(t0.dtype),
                       "shape": list(t0.shape), "layout_hash": self.c._layout_hash}
        logger.info("KvblocksConnector: registered %d layers x %d blocks of %d bytes (%s, role %s)",
                    len(tensors), num_blocks, block_bytes, t0.dtype, self.c._kv_role)
        if self.c._is_producer:
            o = self.c._opts
            host, _ = o.listen  # type: ignore[misc]
            address = "%s:%d" % (o.advertise_host or host, o.notify_port)  # what decodes dial (kv_transfer_params)
            self._server = SideChannelServer(host, o.notify_port, self.c._engine_id, self._hello, self._handoffs,
                                             o.auth_token, address=address)

    def _hello(self) -> Dict[str, Any]:
        assert self.cache is not None
        return {"engine_id": self.c._engine_id, "cluster_id": self._cluster_id, "cache_id": self.cache.cache_id,
                **self.layout}

    # -------------------------------------------------------------- per step

    def start(self, meta: KvblocksConnectorMetadata) -> None:
        for rid, lease in meta.reqs_to_send.items():
            self._handoffs.hold(rid, lease)
        for job in meta.reqs_to_recv.values():
            assert self._pool is not None
            self._pool.submit(self._pull, job)

    def finished(self) -> Tuple[Set[str], Set[str]]:
        released, expired = self._handoffs.finished()
        for rid in expired:
            logger.warning("KvblocksConnector: request %s: no decode pulled its blocks within "
                           "abort_timeout_s=%s; freeing them", rid, self.c._opts.abort_timeout_s)
        sending = released | expired
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

    # -------------------------------------------------------------- pulls

    def _peer(self, info: Dict[str, Any]) -> _Peer:
        key = _peer_key(info)
        with self._peers_lock:
            p = self._peers.get(key)
            if p is None:
                p = self._peers[key] = _Peer(info, self.c._opts, self.c._engine_id)
            return p

    def _ensure_linked(self, p: _Peer, info: Dict[str, Any]) -> None:
        """Hand-shake and link once per peer; again after a failure (a timed-out link is broken)."""
        with p.lock:
            if p.linked and not p.broken:
                return
            if p.linked:  # broken: drop the old link locally before linking again
                try:
                    self.dd.unlink_llm_clusters([p.cluster()], force=True)
                except kb.LLMException:
                    pass
                p.linked = False
            ours = self.c._layout_hash
            theirs = info.get("layout_hash")
            if ours != theirs:
                raise ValueError(f"KvblocksConnector: KV layout of prefill {p.engine_id} (hash {theirs}) differs "
                                 f"from ours ({ours}): block size, dtype, KV heads, head size and number of layers "
                                 "must match")
            hello = p.chan.call({"op": "hello"})
            mine = self.layout
            for k in ("num_tensors", "block_bytes", "dtype", "layout_hash"):
                if hello.get(k) != mine.get(k):
                    raise ValueError(f"KvblocksConnector: prefill {p.engine_id} has {k}={hello.get(k)!r}, this "
                                     f"decode has {mine.get(k)!r}; the KV layouts must match")
            if hello.get("engine_id") != p.engine_id:
                raise ValueError(f"KvblocksConnector: {p.host}:{p.port} is engine {hello.get('engine_id')}, "
                                 f"expected {p.engine_id} (restarted?)")
            p.cluster_id, p.cache_id = int(hello["cluster_id"]), int(hello["cache_id"])
            rets = self.dd.link_llm_clusters([p.cluster()], timeout_in_millis=self.c._opts.link_timeout_ms)
            if rets[0] not in (kb.Status.LLM_SUCCESS, kb.Status.LLM_ALREADY_LINK):
                raise ConnectionError(f"KvblocksConnector: linking to prefill {p.engine_id} at {p.host}:{p.port} "
                                      f"failed: {kb.Status(rets[0]).name}")
            p.linked, p.broken = True, False
            logger.info("KvblocksConnector: linked to prefill %s at %s:%d (%s)", p.engine_id, p.host, p.port,
                        self.dd.link_path(p.cluster_id))

    def _pull(self, job: _RecvJob) -> None:
        info = job.params[PARAMS_KEY]
        ok = False
        p: Optional[_Peer] = None
        t0 = time.perf_counter()
        try:
            p = self._peer(info)
            if job.report:
                src, dst = job.remote_block_ids, job.local_block_ids
                if len(src) != len(dst):
                    raise ValueError(f"KvblocksConnector: request {job.req_id}: {len(src)} remote blocks for "
                                     f"{len(dst)} local ones")
                mode = self.c._opts.test_reverse_blocks
                if mode == "all" or (mode == "per_request" and job.params.get("_test_reverse_blocks")):
                    dst = dst[::-1]  # tests only: a deliberately wrong mapping
                self._ensure_linked(p, info)
                if src:
                    # bound to this decode before the pull: no other decode's "done" can free them meanwhile
                    p.chan.call({"op": "claim", "req": str(info.get("request_id"))})
                    self.dd.pull_kv_blocks(kb.CacheIndex(p.cluster_id, p.cache_id), self.cache, src, dst)
            ok = True
        except Exception as e:  # noqa: BLE001 - any failure: report the blocks, vLLM recomputes them
            if p is not None and not isinstance(e, Refused):  # a refused claim leaves the link as it is
                p.broken = p.broken or p.linked
            logger.warning("KvblocksConnector: request %s: pulling %d blocks from %s failed (%s: %s); vLLM will "
                           "recompute them", job.req_id, len(job.local_block_ids), info.get("engine_id"),
                           type(e).__name__, e)
        took = time.perf_counter() - t0
        if job.report:
            with self._lock:
                if ok:
                    self.pull_seconds.append(took)
                    self._stats.record_pull(took, len(job.remote_block_ids) * self.layout.get("block_bytes", 0)
                                            * self.layout.get("num_tensors", 0))
                else:
                    self._load_errors.update(job.local_block_ids)
                    self._stats.record_failed_pull()
                self._recv_done.add(job.req_id)
        if p is not None:
            self._notify_q.put((p, str(info.get("request_id"))))

    def _notify_loop(self) -> None:
        """Tell prefills "done" off the pull threads' critical path; a dead prefill just fails here."""
        while True:
            item = self._notify_q.get()
            if item is None:
                return
            p, rid = item
            if p.broken and not p.linked:
                continue
            try:
                p.chan.call({"op": "done", "req": rid})
            except Exception as e:  # noqa: BLE001 - its lease frees the blocks instead
                logger.debug("KvblocksConnector: could not notify prefill %s of %s: %s", p.engine_id, rid, e)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._notify_q.put(None)
        if self._server is not None:
            self._server.close()
        for p in list(self._peers.values()):
            p.chan.close()
        try:
            self.dd.finalize()
        except Exception:  # noqa: BLE001
            pass
