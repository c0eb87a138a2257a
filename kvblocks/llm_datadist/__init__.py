# SPDX-License-Identifier: Apache-2.0
"""CANN's Python ``llm_datadist`` API (V2, cache-manager semantics) on kvblocks.

Use it directly (``from kvblocks.llm_datadist import LLMDataDist``) or run an unchanged CANN
program with ``python -m kvblocks.compat program.py`` so that its ``import llm_datadist``
resolves here. kvblocks installs no top-level ``llm_datadist`` package.
"""
import os as _os
from typing import Any as _Any

from kvblocks.llm_datadist.configs import (
    DataType,
    LLMClusterInfo,
    LLMConfig,
    LlmConfig,
    LLMRole,
    MemInfo,
    Memtype,
    Placement,
    RegisterMemStatus,
)
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode, Status
from kvblocks.llm_datadist.v2.cache_manager import CacheManager
from kvblocks.llm_datadist.v2.llm_datadist import LLMDataDist
from kvblocks.llm_datadist.v2.llm_types import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    CacheTask,
    KvCache,
    LayerSynchronizer,
    TransferConfig,
    TransferWithCacheKeyConfig,
)

_os.environ.setdefault("AUTO_USE_UC_MEMORY", "0")

__all__ = [
    "LLMClusterInfo", "LLMStatusCode", "LLMException", "LLMRole", "LlmConfig", "LLMConfig", "DataType", "Status",
    "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "KvCache", "Cache", "BlocksCacheKey", "LLMDataDist",
    "Placement", "RegisterMemStatus", "LayerSynchronizer", "TransferConfig", "CacheTask",
    "TransferWithCacheKeyConfig", "Memtype", "MemInfo", "CacheManager",
]

_V1_ONLY = ("TensorDesc", "Tensor", "KvCacheManager")


def __getattr__(name: str) -> _Any:
    if name in _V1_ONLY:
        raise ImportError(f"llm_datadist.{name} belongs to the legacy V1 engine (llm_datadist_v1), "
                          "which kvblocks does not provide")
    raise AttributeError(f"module 'llm_datadist' has no attribute {name!r}")
