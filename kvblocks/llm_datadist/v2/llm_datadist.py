# SPDX-License-Identifier: Apache-2.0
"""CANN's ``LLMDataDist`` (V2 engine semantics) over the kvblocks core."""
from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import kvblocks as _kb
from kvblocks.llm_datadist._check import check_int32, check_int64, check_isinstance, check_uint32, check_uint64
from kvblocks.llm_datadist.configs import LLMClusterInfo, LLMRole, RegisterMemStatus, int_to_ip
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode, code_2_status, engine_call
from kvblocks.llm_datadist.v2.cache_manager import CacheManager
from kvblocks.llm_datadist.v2.rank_table import listener_of, parse_rank_table

__all__ = ["LLMDataDist"]

_PARAM_INVALID = LLMStatusCode.LLM_PARAM_INVALID
_ACTIVE_LOCK = threading.Lock()
_ACTIVE: Optional["LLMDataDist"] = None

# CANN Python option -> kvblocks C++ option (options not listed are accepted and ignored).
_LISTEN_KEYS = ("llm.listenIpInfo", _kb.OPTION_LISTEN_IP_INFO)
_PASS_THROUGH = (_kb.OPTION_SYNC_CACHE_WAIT_TIME, _kb.OPTION_TRANSFER_BACKEND, _kb.OPTION_LOCAL_COMM_RES,
                 _kb.OPTION_TRANSPORT, _kb.OPTION_AUTH_TOKEN)


def _listen_value(options: Dict[str, str]) -> Optional[str]:
    for k in _LISTEN_KEYS:
        if k in options:
            v = options[k]
            parts = v.split(":") if isinstance(v, str) else []
            if len(parts) != 2 or not parts[0]:
                raise LLMException(f"{k} must be 'ip:port', got {v!r}", status_code=_PARAM_INVALID)
            int(parts[1])  # ValueError for a non-integer port, as CANN
            return v
    return None


def _link_total_s(options: Dict[str, str]) -> float:
    """Seconds a rank-table link() keeps trying: ``llm.LinkTotalTime`` (s) when > 0, else the
    environment variable HCCL_CONNECT_TIMEOUT, else 120, as CANN documents ``link_total_time``."""
    for v in (options.get("llm.LinkTotalTime", ""), os.environ.get("HCCL_CONNECT_TIMEOUT", "")):
        if v.isdigit() and int(v) > 0:
            return float(int(v))
    return 120.0


_COMM_IDS = itertools.count(1)
_RETRY = (LLMStatusCode.LLM_LINK_FAILED, LLMStatusCode.LLM_TIMEOUT, LLMStatusCode.LLM_NOT_YET_LINK,
          LLMStatusCode.LLM_PROCESSING_LINK, LLMStatusCode.LLM_LINK_BUSY)


class _RankGroup:
    """The members of one rank-table link() and the thread that links to them.

    Every member dials every other member (both sides call link(), as CANN's samples do); a
    member whose listener is not up yet is retried every 50 ms until the deadline. The runtime
    resolves two members dialling each other at once (one link survives) and adopts a link the
    peer opened first, so each side's dial ends in one shared link.
    """

    def __init__(self, comm_id: int, comm_name: str, local_ip: str, members: List[Tuple[int, str, int]],
                 total_s: float) -> None:
        self.comm_id = comm_id
        self.comm_name = comm_name
        self.local_ip = local_ip
        self.members = members  # (cluster id, listener ip, listener port), this engine excluded
        self.linked: Set[int] = set()
        self.error: Optional[str] = None
        self.done = False
        self.stop = threading.Event()
        self.deadline = time.monotonic() + total_s
        self.thread: Optional[threading.Thread] = None

    def start(self, engine: Any) -> None:
        self.thread = threading.Thread(target=self._run, args=(engine,), daemon=True,
                                       name=f"kvblocks-link-{self.comm_name}")
        self.thread.start()

    def _run(self, engine: Any) -> None:
        pending = list(self.members)
        try:
            while pending and not self.stop.is_set():
                for m in list(pending):
                    cid, ip, port = m
                    left_ms = int((self.deadline - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        break
                    ci = _kb.ClusterInfo(cid, 0, [_kb.IpInfo(self.local_ip, 0)], [_kb.IpInfo(ip, port)])
                    st = code_2_status(int(engine.link_llm_clusters([ci], min(left_ms, 1000))[0]))
                    if st in (LLMStatusCode.LLM_SUCCESS, LLMStatusCode.LLM_ALREADY_LINK):
                        self.linked.add(cid)
                        pending.remove(m)
                    elif st not in _RETRY:
                        self.error = f"linking cluster {cid} at {ip}:{port} failed: {st}"
                        return
                if pending and (time.monotonic() >= self.deadline or self.stop.wait(0.05)):
                    break
            if pending and not self.stop.is_set():
                self.error = "timed out linking cluster(s) " + ", ".join(
                    f"{c} at {i}:{p}" for c, i, p in pending)
        except Exception as e:  # the engine was finalized under us, or similar
            self.error = f"linking failed: {e}"
        finally:
            self.done = True

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()


def _device_id(options: Dict[str, str]) -> str:
    for k in (_kb.OPTION_DEVICE_ID, "ge.exec.deviceId", "ge.session_device_id"):
        if k in options:
            return options[k].split(";")[0].strip()
    return "0"


class LLMDataDist:
    """One participant: ``LLMDataDist(role, cluster_id)``, then :meth:`init`."""

    def __init__(self, role: LLMRole, cluster_id: int) -> None:
        check_isinstance("role", role, LLMRole, allow_none=False)
        self._role = role
        self._cluster_id = check_uint64("cluster_id", cluster_id)
        self._engine: Optional[Any] = None
        self._initialized = False
        self._cache_manager_mode = False
        self._remote_accessible = False
        self._rank_linked = False
        self._cache_manager: Optional[CacheManager] = None
        self._atexit_registered = False
        self._has_local_comm_res = False
        self._listen_port: Optional[int] = None
        self._link_total_s = 120.0
        self._groups: Dict[int, _RankGroup] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def init(self, options: Dict[str, str]) -> None:
        """Initializes from the options of :meth:`LlmConfig.generate_options`.

        ``llm.LocalCommRes`` (even empty) or ``llm.EnableCacheManager=1`` selects cache-manager
        mode; ``llm.LocalCommRes`` or ``llm.EnableRemoteCacheAccessible=1`` enables remote cache
        access (needed by push). A second initialized instance in one process is refused.
        """
        global _ACTIVE
        check_isinstance("options", options, dict, allow_none=False)
        if self._initialized:
            return
        with _ACTIVE_LOCK:
            if _ACTIVE is not None and _ACTIVE is not self:
                raise LLMException("Cannot init multiple LLMDataDists", status_code=LLMStatusCode.LLM_FAILED)
            for k, v in options.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError("options must map str to str")
            if "ge.flowGraphMemMaxSize" in options:
                v = options["ge.flowGraphMemMaxSize"]
                if not v.isdigit():
                    raise LLMException("ge.flowGraphMemMaxSize must be a single digit string",
                                       status_code=_PARAM_INVALID)
            cm = options.get("llm.EnableCacheManager") == "1" or _kb.OPTION_LOCAL_COMM_RES in options
            remote = options.get("llm.EnableRemoteCacheAccessible") == "1" or _kb.OPTION_LOCAL_COMM_RES in options
            listen = _listen_value(options)
            if _kb.OPTION_TRANSFER_BACKEND in options:
                if not cm:
                    raise LLMException("llm.TransferBackend needs cache-manager mode", status_code=_PARAM_INVALID)
                if not remote:
                    raise LLMException("llm.TransferBackend needs llm.EnableRemoteCacheAccessible=1",
                                       status_code=_PARAM_INVALID)
                if listen is None:
                    raise LLMException("llm.TransferBackend needs llm.listenIpInfo", status_code=_PARAM_INVALID)
            opts = {_kb.OPTION_DEVICE_ID: _device_id(options)}
            if listen is not None:
                opts[_kb.OPTION_LISTEN_IP_INFO] = listen
            for k in _PASS_THROUGH:
                if k in options:
                    opts[k] = options[k]
            # V2 semantics: no role checks; either role and either side of a link may pull and push.
            opts[_kb.OPTION_ROLE_CHECK] = "0" if cm else options.get(_kb.OPTION_ROLE_CHECK, "1")
            engine = _kb.LlmDataDist(self._cluster_id, _kb.LlmRole(int(self._role)))
            with engine_call("init"):
                engine.initialize(opts)
            self._engine = engine
            self._cache_manager_mode = cm
            self._remote_accessible = remote
            self._has_local_comm_res = bool(options.get(_kb.OPTION_LOCAL_COMM_RES))
            self._rank_linked = False
            self._listen_port = int(listen.split(":")[1]) if listen is not None else None
            self._link_total_s = _link_total_s(options)
            self._groups = {}
            self._cache_manager = CacheManager(self) if cm else None
            self._initialized = True
            _ACTIVE = self
        if not self._atexit_registered:
            atexit.register(self.finalize)
            self._atexit_registered = True

    def finalize(self) -> None:
        """Tears everything down; :meth:`init` may be called again. No-op if not initialized."""
        global _ACTIVE
        if not self._initialized:
            return
        with _ACTIVE_LOCK:
            for g in self._groups.values():
                g.halt()
            self._groups = {}
            if self._engine is not None:
                self._engine.finalize()
            self._initialized = False
            self._cache_manager = None
            if _ACTIVE is self:
                _ACTIVE = None

    def _engine_or_none(self) -> Optional[Any]:
        return self._engine if self._initialized else None

    def _require_init(self) -> Any:
        if not self._initialized or self._engine is None:
            raise RuntimeError("llm datadist is not initialized")
        return self._engine

    # -- properties -------------------------------------------------------------------------
    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def role(self) -> LLMRole:
        return self._role

    @property
    def cache_manager(self) -> CacheManager:
        self._require_init()
        if self._cache_manager is None:
            raise LLMException("cache_manager is only available in cache-manager mode (set local_comm_res or "
                               "enable_cache_manager)", status_code=_PARAM_INVALID)
        return self._cache_manager

    @property
    def kv_cache_manager(self) -> Any:
        self._require_init()
        if self._cache_manager_mode:
            raise LLMException("kv_cache_manager is not available in cache-manager mode", status_code=_PARAM_INVALID)
        raise LLMException("the legacy V1 KvCacheManager is not provided by kvblocks; use cache-manager mode",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    # -- links ------------------------------------------------------------------------------
    def _clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                  for_unlink: bool, force: bool = False) -> List[_kb.ClusterInfo]:
        check_isinstance("clusters", clusters, (list, tuple), allow_none=False)
        out = []
        for c in clusters:
            check_isinstance("clusters", c, LLMClusterInfo, allow_none=False)
            if c.remote_cluster_id is None:
                raise TypeError("remote_cluster_id must be set (uint64), got None")
            check_uint64("remote_cluster_id", c.remote_cluster_id)
            if not for_unlink and self._cache_manager_mode and not c.local_ip_info_list \
                    and not self._has_local_comm_res:
                raise LLMException("local_ip_info_list is empty and local_comm_res is not set",
                                   status_code=_PARAM_INVALID)
            local = [_kb.IpInfo(int_to_ip(i), p) for i, p in c.local_ip_info_list]
            remote = [_kb.IpInfo(int_to_ip(i), p) for i, p in c.remote_ip_info_list]
            out.append(_kb.ClusterInfo(c.remote_cluster_id, int(c.remote_role_type), local, remote))
        return out

    def _aggregate(self, n: int, call: Any) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        try:
            rets = [code_2_status(int(r)) for r in call()]
        except LLMException:
            raise
        except _kb.LLMException as e:
            st = code_2_status(int(e.status_code))
            return st, [st] * n
        overall = LLMStatusCode.LLM_SUCCESS
        for r in rets:
            if r != LLMStatusCode.LLM_SUCCESS:
                overall = r
        return overall, rets

    def link_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                      timeout: int = 3000) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Links to each cluster; returns ``(overall, per-cluster)`` codes instead of raising."""
        engine = self._require_init()
        check_int32("timeout", timeout)
        if timeout <= 0:
            raise LLMException(f"timeout must be > 0, got {timeout}", status_code=_PARAM_INVALID)
        cs = self._clusters(clusters, False)
        return self._aggregate(len(cs), lambda: engine.link_llm_clusters(cs, timeout))

    def unlink_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                        timeout: int = 3000, force: bool = False) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Unlinks; only ``remote_cluster_id`` is needed (kvblocks keys links by cluster id, as CANN's
        hixl backend does), a remote ip info is optional and unused; ``force=True`` tears down locally."""
        engine = self._require_init()
        check_isinstance("force", force, bool, allow_none=False)
        check_int32("timeout", timeout)
        if timeout <= 0:
            raise LLMException(f"timeout must be > 0, got {timeout}", status_code=_PARAM_INVALID)
        cs = self._clusters(clusters, True, force)
        return self._aggregate(len(cs), lambda: engine.unlink_llm_clusters(cs, timeout, force))

    def switch_role(self, role: LLMRole, switch_options: Optional[Dict[str, str]] = None, *,
                    options: Optional[Dict[str, str]] = None) -> None:
        """Switches role; ``llm.listenIpInfo`` in the options starts (or moves) the listener.
        Existing links -> LLMException(LLM_EXIST_LINK)."""
        engine = self._require_init()
        check_isinstance("role", role, LLMRole, allow_none=False)
        opts_in = switch_options if switch_options is not None else (options or {})
        check_isinstance("switch_options", opts_in, dict, allow_none=False)
        listen = _listen_value(opts_in)
        if not self._cache_manager_mode:
            if role == self._role:
                raise LLMException(f"role is already {role}", status_code=_PARAM_INVALID)
            if role == LLMRole.PROMPT and listen is None:
                raise LLMException("switching to PROMPT needs llm.listenIpInfo", status_code=_PARAM_INVALID)
        opts = {_kb.OPTION_LISTEN_IP_INFO: listen} if listen is not None else {}
        with engine_call("switch_role"):
            engine.set_role(_kb.LlmRole(int(role)), opts)
        self._role = role
        if listen is not None:
            self._listen_port = int(listen.split(":")[1])

    def check_link_status(self, remote_cluster_id: int) -> None:
        self._require_init()
        raise LLMException("check_link_status is only available in legacy mode, which kvblocks does not provide",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    # -- rank-table links ------------------------------------------------------------------
    def link(self, comm_name: str, cluster_rank_info: Dict[int, int], rank_table: str) -> int:
        """Links this engine to the other members of a CANN rank table; returns a comm id.

        ``cluster_rank_info`` maps each member's cluster id (this engine's included) to its
        ``rank_id`` in ``rank_table``. Each other member's kvblocks listener is its
        ``device_ip`` with the device's ``device_port`` (kvblocks extension), else this engine's
        own listen port. Linking runs in the background: poll :meth:`query_register_mem_status`
        until ``RegisterMemStatus.OK``.
        """
        engine = self._require_init()
        check_isinstance("comm_name", comm_name, str, allow_none=False)
        check_isinstance("cluster_rank_info", cluster_rank_info, dict, allow_none=False)
        check_isinstance("rank_table", rank_table, str, allow_none=False)
        if not comm_name or len(comm_name) >= 128:
            raise LLMException("comm_name must be non-empty and shorter than 128", status_code=_PARAM_INVALID)
        if not 2 <= len(cluster_rank_info) <= 4:
            raise LLMException("cluster_rank_info needs 2 to 4 entries", status_code=_PARAM_INVALID)
        for cid, rank in cluster_rank_info.items():
            check_uint64("cluster_rank_info key", cid)
            check_uint32("cluster_rank_info value", rank)
        ranks = list(cluster_rank_info.values())
        if ranks != sorted(ranks) or len(set(ranks)) != len(ranks):
            raise LLMException("ranks must be unique and ascending", status_code=_PARAM_INVALID)
        if not self._cache_manager_mode:
            raise LLMException("link() needs cache-manager mode (set local_comm_res or enable_cache_manager)",
                               status_code=_PARAM_INVALID)
        if self._cluster_id not in cluster_rank_info:
            raise LLMException(f"cluster_rank_info has no entry for this LLMDataDist's cluster id "
                               f"{self._cluster_id}", status_code=_PARAM_INVALID)
        table = parse_rank_table(rank_table)
        for cid, rank in cluster_rank_info.items():
            if rank not in table:
                raise LLMException(f"rank_table: rank_id {rank} (cluster_rank_info[{cid}]) is not in server_list",
                                   status_code=_PARAM_INVALID)
        local_ip = table[cluster_rank_info[self._cluster_id]].device_ip
        members = [(cid, *listener_of(table[rank], self._listen_port))
                   for cid, rank in cluster_rank_info.items() if cid != self._cluster_id]
        group = _RankGroup(next(_COMM_IDS), comm_name, local_ip, members, self._link_total_s)
        self._groups[group.comm_id] = group
        self._rank_linked = True
        group.start(engine)
        return group.comm_id

    def _group(self, comm_id: int) -> _RankGroup:
        check_int64("comm_id", comm_id)
        g = self._groups.get(comm_id)
        if g is None:
            raise LLMException(f"comm_id {comm_id} is unknown (not returned by link(), or already unlinked)",
                               status_code=_PARAM_INVALID)
        return g

    def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        """``PREPARING`` while members are being linked, ``OK`` once every other member was linked
        (it stays OK until :meth:`unlink`: a link lost later shows in transfers, as
        ``LLM_NOT_YET_LINK``), ``FAILED`` when linking gave up (deadline ``llm.LinkTotalTime``, or a
        refusal)."""
        self._require_init()
        g = self._group(comm_id)
        if g.error is not None:
            return RegisterMemStatus.FAILED
        return RegisterMemStatus.OK if g.done else RegisterMemStatus.PREPARING

    def unlink(self, comm_id: int) -> None:
        """Unlinks every member of the rank-table group ``comm_id`` (a member that another group
        still holds stays linked); unknown id -> LLMException(LLM_PARAM_INVALID)."""
        engine = self._require_init()
        g = self._group(comm_id)
        g.halt()
        del self._groups[comm_id]
        held = {cid for other in self._groups.values() for cid, _, _ in other.members}
        clusters = [_kb.ClusterInfo(cid) for cid, _, _ in g.members if cid not in held]
        if not clusters:
            return
        overall, rets = self._aggregate(len(clusters), lambda: engine.unlink_llm_clusters(clusters, 3000))
        if overall != LLMStatusCode.LLM_SUCCESS:
            raise LLMException(f"unlink failed, error code is {overall}, per member: "
                               + ", ".join(f"{c.remote_cluster_id}: {r}" for c, r in zip(clusters, rets)),
                               status_code=overall)
