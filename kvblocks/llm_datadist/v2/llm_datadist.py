# SPDX-License-Identifier: Apache-2.0
"""CANN's ``LLMDataDist`` (V2 engine semantics) over the kvblocks core."""
from __future__ import annotations

import atexit
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import kvblocks as _kb
from kvblocks.llm_datadist._check import check_int32, check_isinstance, check_uint64
from kvblocks.llm_datadist.configs import LLMClusterInfo, LLMRole, RegisterMemStatus, int_to_ip
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode, code_2_status, engine_call
from kvblocks.llm_datadist.v2.cache_manager import CacheManager

__all__ = ["LLMDataDist"]

_PARAM_INVALID = LLMStatusCode.LLM_PARAM_INVALID
_ACTIVE_LOCK = threading.Lock()
_ACTIVE: Optional["LLMDataDist"] = None

# CANN Python option -> kvblocks C++ option (options not listed are accepted and ignored).
_LISTEN_KEYS = ("llm.listenIpInfo", "llm.ListenIpInfo")
_PASS_THROUGH = ("llm.SyncKvCacheWaitTime", "llm.TransferBackend", "llm.LocalCommRes", _kb.OPTION_TRANSPORT,
                 _kb.OPTION_AUTH_TOKEN)


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


def _device_id(options: Dict[str, str]) -> str:
    for k in ("llm.DeviceId", "ge.exec.deviceId", "ge.session_device_id"):
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
            cm = options.get("llm.EnableCacheManager") == "1" or "llm.LocalCommRes" in options
            remote = options.get("llm.EnableRemoteCacheAccessible") == "1" or "llm.LocalCommRes" in options
            listen = _listen_value(options)
            if "llm.TransferBackend" in options:
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
            self._has_local_comm_res = bool(options.get("llm.LocalCommRes"))
            self._rank_linked = False
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
        """Unlinks; ``force=True`` tears down locally and needs only ``remote_cluster_id``."""
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

    def check_link_status(self, remote_cluster_id: int) -> None:
        self._require_init()
        raise LLMException("check_link_status is only available in legacy mode, which kvblocks does not provide",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    # -- rank-table links (not supported) ---------------------------------------------------
    def link(self, comm_name: str, cluster_rank_info: Dict[int, int], rank_table: str) -> int:
        """Rank-table linking: arguments are validated as CANN does, then refused
        (kvblocks links over TCP with :meth:`link_clusters`)."""
        self._require_init()
        check_isinstance("comm_name", comm_name, str, allow_none=False)
        check_isinstance("cluster_rank_info", cluster_rank_info, dict, allow_none=False)
        check_isinstance("rank_table", rank_table, str, allow_none=False)
        if not comm_name or len(comm_name) >= 128:
            raise LLMException("comm_name must be non-empty and shorter than 128", status_code=_PARAM_INVALID)
        if not 2 <= len(cluster_rank_info) <= 4:
            raise LLMException("cluster_rank_info needs 2 to 4 entries", status_code=_PARAM_INVALID)
        ranks = list(cluster_rank_info.values())
        if ranks != sorted(ranks) or len(set(ranks)) != len(ranks):
            raise LLMException("ranks must be unique and ascending", status_code=_PARAM_INVALID)
        raise LLMException("rank-table link() is not supported by kvblocks; use link_clusters",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    def unlink(self, comm_id: int) -> None:
        self._require_init()
        raise LLMException("rank-table unlink() is not supported by kvblocks",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        self._require_init()
        raise LLMException("query_register_mem_status is not supported by kvblocks",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
