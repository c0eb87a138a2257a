# SPDX-License-Identifier: Apache-2.0
"""Roles, placements, data types, LlmConfig and LLMClusterInfo of CANN's ``llm_datadist``."""
from __future__ import annotations

import enum
import json
import socket
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from kvblocks.llm_datadist._check import (
    check_int32,
    check_isinstance,
    check_uint16,
    check_uint32,
    check_uint64,
)
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode

__all__ = ["LLMRole", "Placement", "DataType", "RegisterMemStatus", "Memtype", "MemInfo", "LlmConfig",
           "LLMConfig", "LLMClusterInfo"]


class _NamedIntEnum(enum.IntEnum):
    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class LLMRole(_NamedIntEnum):
    PROMPT = 1
    DECODER = 2
    MIX = 3


class Placement(_NamedIntEnum):
    """``DEVICE`` is served by host memory on a machine without an accelerator."""
    HOST = 0
    DEVICE = 1


class DataType(_NamedIntEnum):
    """The 14 element types of CANN's Python API, with ge's numbering."""
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_BF16 = 27
    DT_INT8 = 2
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT8 = 4
    DT_INT32 = 3
    DT_INT64 = 9
    DT_UINT32 = 8
    DT_UINT64 = 10
    DT_BOOL = 12
    DT_DOUBLE = 11
    DT_STRING = 13


class RegisterMemStatus(enum.Enum):
    OK = 0
    PREPARING = 1
    FAILED = 2


class Memtype(enum.Enum):
    MEM_TYPE_DEVICE = 0
    MEM_TYPE_HOST = 1


class MemInfo:
    """``MemInfo(mem_type, addr, size)`` for :meth:`CacheManager.remap_registered_memory`; read-only.

    Raises TypeError for a wrong type (None is let through, as CANN).
    """

    def __init__(self, mem_type: Memtype, addr: int, size: int) -> None:
        check_isinstance("mem_type", mem_type, Memtype)
        check_isinstance("addr", addr, int)
        check_isinstance("size", size, int)
        self._mem_type = mem_type
        self._addr = addr
        self._size = size

    @property
    def mem_type(self) -> Memtype:
        return self._mem_type

    @property
    def addr(self) -> int:
        return self._addr

    @property
    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"MemInfo(mem_type={self._mem_type}, addr={self._addr}, size={self._size})"

    __str__ = __repr__


def _uint_str(name: str, value: Union[int, str], *, positive: bool = False) -> int:
    if isinstance(value, str):
        if not value.isdigit():
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        value = int(value)
    v = check_int32(name, value)
    if v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {v}")
    return v


class LlmConfig:
    """Builds the options dict passed to :meth:`LLMDataDist.init` (``generate_options()``)."""

    def __init__(self) -> None:
        self._device_id: Optional[List[int]] = None
        self._listen_ip_info: Optional[str] = None
        self._sync_kv_timeout: Optional[int] = None
        self._enable_cache_manager: Optional[bool] = None
        self._enable_remote_cache_accessible: Optional[bool] = None
        self._mem_pool_cfg: Optional[str] = None
        self._host_mem_pool_cfg: Optional[str] = None
        self._local_comm_res: Optional[str] = None
        self._transfer_backend: Optional[str] = None
        self._global_resource_config: Optional[str] = None
        self._rdma_traffic_class: Optional[int] = None
        self._rdma_service_level: Optional[int] = None
        self._link_total_time: Optional[int] = None
        self._link_retry_count: Optional[int] = None
        self._enable_switch_role: Optional[bool] = None
        self._mem_utilization: float = 0.95
        self._buf_pool_cfg: Optional[str] = None
        self._deploy_res_path: Optional[str] = None
        self._cluster_info: Optional[str] = None
        self._output_max_size: Optional[int] = None
        self._ge_options: Dict[str, str] = {}

    # -- properties -------------------------------------------------------------------------
    @property
    def device_id(self) -> Optional[Union[int, List[int]]]:
        if self._device_id is None:
            return None
        return self._device_id[0] if len(self._device_id) == 1 else list(self._device_id)

    @device_id.setter
    def device_id(self, value: Union[int, Sequence[int]]) -> None:
        ids: List[object] = list(value) if isinstance(value, (list, tuple)) else [value]
        out: List[int] = []
        for i in ids:
            v = check_int32("device_id", i)
            if v < 0:
                raise ValueError(f"device_id must be >= 0, got {v}")
            out.append(v)
        self._device_id = out

    @property
    def listen_ip_info(self) -> Optional[str]:
        return self._listen_ip_info

    @listen_ip_info.setter
    def listen_ip_info(self, value: str) -> None:
        check_isinstance("listen_ip_info", value, str, allow_none=False)
        self._listen_ip_info = value

    @property
    def sync_kv_timeout(self) -> Optional[int]:
        return self._sync_kv_timeout

    @sync_kv_timeout.setter
    def sync_kv_timeout(self, value: Union[int, str]) -> None:
        self._sync_kv_timeout = _uint_str("sync_kv_timeout", value, positive=True)

    @property
    def enable_cache_manager(self) -> Optional[bool]:
        return self._enable_cache_manager

    @enable_cache_manager.setter
    def enable_cache_manager(self, value: bool) -> None:
        check_isinstance("enable_cache_manager", value, bool, allow_none=False)
        self._enable_cache_manager = value

    @property
    def enable_remote_cache_accessible(self) -> Optional[bool]:
        return self._enable_remote_cache_accessible

    @enable_remote_cache_accessible.setter
    def enable_remote_cache_accessible(self, value: bool) -> None:
        check_isinstance("enable_remote_cache_accessible", value, bool, allow_none=False)
        self._enable_remote_cache_accessible = value

    @staticmethod
    def _pool_cfg(name: str, value: str) -> str:
        check_isinstance(name, value, str, allow_none=False)
        try:
            cfg = json.loads(value)
        except ValueError as e:
            raise LLMException(f"{name} is not valid json: {e}", status_code=LLMStatusCode.LLM_PARAM_INVALID) from e
        if not isinstance(cfg, dict) or "memory_size" not in cfg:
            raise LLMException(f"{name} needs memory_size", status_code=LLMStatusCode.LLM_PARAM_INVALID)
        size = cfg["memory_size"]
        if not isinstance(size, int) or size <= 0:
            raise LLMException(f"{name}.memory_size must be > 0", status_code=LLMStatusCode.LLM_PARAM_INVALID)
        shift = cfg.get("page_shift", 16)
        if not isinstance(shift, int) or not 10 <= shift < 31:
            raise LLMException(f"{name}.page_shift must be in [10, 31)", status_code=LLMStatusCode.LLM_PARAM_INVALID)
        return value

    @property
    def mem_pool_cfg(self) -> Optional[str]:
        return self._mem_pool_cfg

    @mem_pool_cfg.setter
    def mem_pool_cfg(self, value: str) -> None:
        self._mem_pool_cfg = self._pool_cfg("mem_pool_cfg", value)

    @property
    def host_mem_pool_cfg(self) -> Optional[str]:
        return self._host_mem_pool_cfg

    @host_mem_pool_cfg.setter
    def host_mem_pool_cfg(self, value: str) -> None:
        self._host_mem_pool_cfg = self._pool_cfg("host_mem_pool_cfg", value)

    @property
    def local_comm_res(self) -> Optional[str]:
        return self._local_comm_res

    @local_comm_res.setter
    def local_comm_res(self, value: str) -> None:
        check_isinstance("local_comm_res", value, str, allow_none=False)
        self._local_comm_res = value

    @property
    def transfer_backend(self) -> Optional[str]:
        return self._transfer_backend

    @transfer_backend.setter
    def transfer_backend(self, value: str) -> None:
        check_isinstance("transfer_backend", value, str, allow_none=False)
        self._transfer_backend = value

    @property
    def global_resource_config(self) -> Optional[str]:
        return self._global_resource_config

    @global_resource_config.setter
    def global_resource_config(self, value: str) -> None:
        check_isinstance("global_resource_config", value, str, allow_none=False)
        self._global_resource_config = value

    @property
    def rdma_traffic_class(self) -> Optional[int]:
        return self._rdma_traffic_class

    @rdma_traffic_class.setter
    def rdma_traffic_class(self, value: int) -> None:
        self._rdma_traffic_class = check_uint32("rdma_traffic_class", value)

    @property
    def rdma_service_level(self) -> Optional[int]:
        return self._rdma_service_level

    @rdma_service_level.setter
    def rdma_service_level(self, value: int) -> None:
        self._rdma_service_level = check_uint32("rdma_service_level", value)

    @property
    def link_total_time(self) -> Optional[int]:
        return self._link_total_time

    @link_total_time.setter
    def link_total_time(self, value: int) -> None:
        self._link_total_time = check_uint32("link_total_time", value)

    @property
    def link_retry_count(self) -> Optional[int]:
        return self._link_retry_count

    @link_retry_count.setter
    def link_retry_count(self, value: int) -> None:
        v = check_uint32("link_retry_count", value)
        if not 1 <= v <= 100:
            raise ValueError(f"link_retry_count must be in [1, 100], got {v}")
        self._link_retry_count = v

    @property
    def enable_switch_role(self) -> Optional[bool]:
        return self._enable_switch_role

    @enable_switch_role.setter
    def enable_switch_role(self, value: bool) -> None:
        check_isinstance("enable_switch_role", value, bool, allow_none=False)
        self._enable_switch_role = value

    @property
    def mem_utilization(self) -> float:
        return self._mem_utilization

    @mem_utilization.setter
    def mem_utilization(self, value: float) -> None:
        check_isinstance("mem_utilization", value, (float, int), allow_none=False)
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"mem_utilization must be in [0, 1], got {value}")
        self._mem_utilization = float(value)

    @property
    def buf_pool_cfg(self) -> Optional[str]:
        return self._buf_pool_cfg

    @buf_pool_cfg.setter
    def buf_pool_cfg(self, value: str) -> None:
        check_isinstance("buf_pool_cfg", value, str, allow_none=False)
        self._buf_pool_cfg = value

    @property
    def deploy_res_path(self) -> Optional[str]:
        return self._deploy_res_path

    @deploy_res_path.setter
    def deploy_res_path(self, value: str) -> None:
        check_isinstance("deploy_res_path", value, str, allow_none=False)
        self._deploy_res_path = value

    @property
    def cluster_info(self) -> Optional[str]:
        return self._cluster_info

    @cluster_info.setter
    def cluster_info(self, value: str) -> None:
        check_isinstance("cluster_info", value, str, allow_none=False)
        self._cluster_info = value

    @property
    def output_max_size(self) -> Optional[int]:
        return self._output_max_size

    @output_max_size.setter
    def output_max_size(self, value: int) -> None:
        self._output_max_size = check_uint32("output_max_size", value)

    @property
    def ge_options(self) -> Dict[str, str]:
        return dict(self._ge_options)

    @ge_options.setter
    def ge_options(self, value: Dict[str, str]) -> None:
        check_isinstance("ge_options", value, dict, allow_none=False)
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("ge_options must map str to str")
        self._ge_options = dict(value)

    # -- options ----------------------------------------------------------------------------
    def generate_options(self) -> Dict[str, str]:
        """The options dict for :meth:`LLMDataDist.init`."""
        opts: Dict[str, str] = dict(self._ge_options)
        if self._device_id is not None:
            opts["ge.exec.deviceId"] = ";".join(str(i) for i in self._device_id)
            opts["ge.session_device_id"] = str(self._device_id[0])
        if self._listen_ip_info is not None:
            opts["llm.listenIpInfo"] = self._listen_ip_info
        if self._sync_kv_timeout is not None:
            opts["llm.SyncKvCacheWaitTime"] = str(self._sync_kv_timeout)
        if self._enable_cache_manager is not None:
            opts["llm.EnableCacheManager"] = "1" if self._enable_cache_manager else "0"
        remote = self._enable_remote_cache_accessible
        if self._local_comm_res is not None or self._transfer_backend is not None:
            remote = True
        if remote is not None:
            opts["llm.EnableRemoteCacheAccessible"] = "1" if remote else "0"
        if self._mem_pool_cfg is not None:
            opts["llm.MemPoolConfig"] = self._mem_pool_cfg
        if self._host_mem_pool_cfg is not None:
            opts["llm.HostMemPoolConfig"] = self._host_mem_pool_cfg
        if self._local_comm_res is not None:
            opts["llm.LocalCommRes"] = self._local_comm_res
        if self._transfer_backend is not None:
            opts["llm.TransferBackend"] = self._transfer_backend
        if self._global_resource_config is not None:
            opts["llm.GlobalResourceConfig"] = self._global_resource_config
        if self._rdma_traffic_class is not None:
            opts["llm.RdmaTrafficClass"] = str(self._rdma_traffic_class)
        if self._rdma_service_level is not None:
            opts["llm.RdmaServiceLevel"] = str(self._rdma_service_level)
        if self._link_total_time is not None:
            opts["llm.LinkTotalTime"] = str(self._link_total_time)
        if self._link_retry_count is not None:
            opts["llm.LinkRetryCount"] = str(self._link_retry_count)
        if self._enable_switch_role:
            opts["llm.EnableSwitchRole"] = "1"
        opts["llm.MemoryUtilization"] = str(self._mem_utilization)
        if self._buf_pool_cfg is not None:
            opts["llm.BufPoolCfg"] = self._buf_pool_cfg
        if self._deploy_res_path is not None:
            opts["llm.DeployResPath"] = self._deploy_res_path
        if self._cluster_info is not None:
            opts["llm.ClusterInfo"] = self._cluster_info
        if self._output_max_size is not None:
            opts["llm.OutputMaxSize"] = str(self._output_max_size)
        return opts

    gen_options = generate_options

    @property
    def options(self) -> Mapping[str, str]:
        """A read-only view of what :meth:`generate_options` returns now: a fresh snapshot on each
        access (later setter calls do not change a view already taken). Pass ``dict(cfg.options)``
        or ``cfg.generate_options()`` where a mutable dict is needed.

        Raises TypeError on an attempt to modify the view (and AttributeError on assignment)."""
        return MappingProxyType(self.generate_options())


LLMConfig = LlmConfig


def ip_to_int(ip: Union[str, int]) -> int:
    """IPv4 string -> int with the first octet in the lowest byte (CANN's encoding)."""
    if isinstance(ip, int):
        return check_uint32("ip", ip)
    try:
        return int.from_bytes(socket.inet_aton(ip), "little")
    except OSError as e:
        raise RuntimeError(f"invalid ip {ip!r}: {e}") from e


def int_to_ip(value: int) -> str:
    return socket.inet_ntoa(int(value).to_bytes(4, "little"))


class LLMClusterInfo:
    """A peer to link to: ``remote_cluster_id`` plus local and remote ``(ip_int, port)`` pairs."""

    def __init__(self) -> None:
        self._remote_cluster_id: Optional[int] = None
        self._remote_role_type: Union[LLMRole, int] = 0
        self._local_ip_info_list: List[Tuple[int, int]] = []
        self._remote_ip_info_list: List[Tuple[int, int]] = []

    @property
    def remote_cluster_id(self) -> Optional[int]:
        return self._remote_cluster_id

    @remote_cluster_id.setter
    def remote_cluster_id(self, value: int) -> None:
        self._remote_cluster_id = check_uint64("remote_cluster_id", value)

    @property
    def remote_role_type(self) -> Union[LLMRole, int]:
        return self._remote_role_type

    @remote_role_type.setter
    def remote_role_type(self, value: Union[LLMRole, int]) -> None:
        check_isinstance("remote_role_type", value, int, allow_none=False)
        self._remote_role_type = value

    @property
    def local_ip_info_list(self) -> List[Tuple[int, int]]:
        return self._local_ip_info_list

    @property
    def remote_ip_info_list(self) -> List[Tuple[int, int]]:
        return self._remote_ip_info_list

    @staticmethod
    def _ip_info(ip: Union[str, int], port: int) -> Tuple[int, int]:
        check_isinstance("ip", ip, (str, int), allow_none=False)
        return ip_to_int(ip), check_uint16("port", port)

    def append_local_ip_info(self, ip: Union[str, int], port: int) -> None:
        self._local_ip_info_list.append(self._ip_info(ip, port))

    def append_remote_ip_info(self, ip: Union[str, int], port: int) -> None:
        self._remote_ip_info_list.append(self._ip_info(ip, port))

    def __repr__(self) -> str:
        return (f"LLMClusterInfo(remote_cluster_id={self._remote_cluster_id}, "
                f"local={[(int_to_ip(i), p) for i, p in self._local_ip_info_list]}, "
                f"remote={[(int_to_ip(i), p) for i, p in self._remote_ip_info_list]})")
