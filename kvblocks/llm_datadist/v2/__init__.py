# SPDX-License-Identifier: Apache-2.0
"""``llm_datadist.v2``: the V2 (cache-manager) engine types."""
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

__all__ = ["BlocksCacheKey", "Cache", "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "CacheManager", "CacheTask",
           "KvCache", "LLMDataDist", "LayerSynchronizer", "TransferConfig", "TransferWithCacheKeyConfig"]
