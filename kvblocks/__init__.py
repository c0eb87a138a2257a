# SPDX-License-Identifier: Apache-2.0
"""kvblocks: KV-cache block transfer for disaggregated LLM serving.

API-compatible with Huawei CANN LLM-DataDist (``PullKvBlocks`` / ``PushKvBlocks``), on any Linux
machine: in-process copies, same-host shared memory, and TCP between hosts.
"""
import os as _os

from kvblocks._errors import (
    CacheNotExistError,
    FeatureNotEnabledError,
    LinkError,
    LLMException,
    LLMOutOfMemoryError,
    LLMTimeoutError,
    ParamInvalidError,
    Status,
)
from kvblocks._lib import (
    OPTION_AUTH_TOKEN,
    OPTION_BUF_POOL_CFG,
    OPTION_DEVICE_ID,
    OPTION_ENABLE_SET_ROLE,
    OPTION_GLOBAL_RESOURCE_CONFIG,
    OPTION_LISTEN_IP_INFO,
    OPTION_LOCAL_COMM_RES,
    OPTION_ROLE_CHECK,
    OPTION_SYNC_CACHE_WAIT_TIME,
    OPTION_TRANSFER_BACKEND,
    OPTION_TRANSPORT,
    Cache,
    CacheDesc,
    CacheIndex,
    CachePlacement,
    ClusterInfo,
    DataType,
    IpInfo,
    KvCacheExtParam,
    LlmDataDist,
    LlmRole,
    validate_blocks,
)

__version__ = "0.1.0"


def get_include() -> str:
    """Directory holding ``llm_datadist/llm_datadist.h`` and the ``.pxd`` files' package root."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    inc = _os.path.join(here, "include")
    if _os.path.isdir(inc):
        return inc
    return _os.path.join(_os.path.dirname(here), "include")  # a source checkout


def get_library_dir() -> str:
    """Directory holding ``libllm_datadist.so``."""
    return _os.path.dirname(_os.path.abspath(__file__))


__all__ = [
    "Cache", "CacheDesc", "CacheIndex", "CacheNotExistError", "CachePlacement", "ClusterInfo", "DataType",
    "FeatureNotEnabledError", "IpInfo", "KvCacheExtParam", "LLMException", "LLMOutOfMemoryError",
    "LLMTimeoutError", "LinkError", "LlmDataDist", "LlmRole", "ParamInvalidError", "Status",
    "OPTION_AUTH_TOKEN", "OPTION_BUF_POOL_CFG", "OPTION_DEVICE_ID", "OPTION_ENABLE_SET_ROLE",
    "OPTION_GLOBAL_RESOURCE_CONFIG", "OPTION_LISTEN_IP_INFO", "OPTION_LOCAL_COMM_RES", "OPTION_ROLE_CHECK",
    "OPTION_SYNC_CACHE_WAIT_TIME", "OPTION_TRANSFER_BACKEND", "OPTION_TRANSPORT", "get_include",
    "get_library_dir", "validate_blocks",
]
