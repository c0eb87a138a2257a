# SPDX-License-Identifier: Apache-2.0
"""Cache types of CANN's ``llm_datadist.v2.llm_types``: CacheDesc, Cache and the cache keys."""
from __future__ import annotations

import abc
from typing import Any, List, Optional, Sequence, Tuple, Union

import kvblocks as _kb
from kvblocks.llm_datadist._check import (
    check_int32,
    check_int64,
    check_isinstance,
    check_uint32,
    check_uint64,
)
from kvblocks.llm_datadist.configs import DataType, Placement
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode

__all__ = ["CacheDesc", "Cache", "KvCache", "CacheKey", "CacheKeyByIdAndIndex", "BlocksCacheKey",
           "TransferConfig", "TransferWithCacheKeyConfig", "LayerSynchronizer", "CacheTask"]

_U64_MAX = 2**64 - 1
_PARAM_INVALID = LLMStatusCode.LLM_PARAM_INVALID


class CacheDesc:
    """``num_tensors`` tensors of ``shape`` and ``data_type``; blocks are along ``shape[0]``."""

    def __init__(self, num_tensors: int, shape: Union[List[int], Tuple[int, ...]], data_type: DataType,
                 placement: Placement = Placement.DEVICE, batch_dim_index: int = 0,
                 seq_len_dim_index: int = -1, kv_tensor_format: Optional[str] = None) -> None:
        check_uint32("num_tensors", num_tensors)
        check_isinstance("shape", shape, (list, tuple), allow_none=False)
        for d in shape:
            check_isinstance("shape", d, int, allow_none=False)
        check_isinstance("data_type", data_type, DataType, allow_none=False)
        check_isinstance("placement", placement, Placement, allow_none=False)
        check_isinstance("batch_dim_index", batch_dim_index, int, allow_none=False)
        check_int32("seq_len_dim_index", seq_len_dim_index)
        check_isinstance("kv_tensor_format", kv_tensor_format, str)
        if not 0 <= batch_dim_index < len(shape):
            raise LLMException(f"batch_dim_index {batch_dim_index} is out of range for shape {list(shape)}",
                               status_code=_PARAM_INVALID)
        if seq_len_dim_index != -1 and not 0 <= seq_len_dim_index < len(shape):
            raise LLMException(f"seq_len_dim_index {seq_len_dim_index} is out of range for shape {list(shape)}",
                               status_code=_PARAM_INVALID)
        for d in shape:
            check_int64("shape", d)
        self._num_tensors = int(num_tensors)
        self._shape = [int(d) for d in shape]
        self._data_type = data_type
        self._placement = placement
        self._batch_dim_index = int(batch_dim_index)
        self._seq_len_dim_index = int(seq_len_dim_index)
        self._kv_tensor_format = kv_tensor_format

    @property
    def num_tensors(self) -> int:
        return self._num_tensors

    @property
    def shape(self) -> List[int]:
        return list(self._shape)

    @property
    def data_type(self) -> DataType:
        return self._data_type

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def batch_dim(self) -> int:
        return self._batch_dim_index

    @property
    def batch_size(self) -> int:
        return self._shape[self._batch_dim_index]

    @property
    def seq_len_dim_index(self) -> int:
        return self._seq_len_dim_index

    @property
    def kv_tensor_format(self) -> Optional[str]:
        return self._kv_tensor_format

    @property
    def size(self) -> int:
        """Bytes of one tensor. Raises LLMException (status LLM_SUCCESS, as CANN) if not computable."""
        n = int(self._to_kb().tensor_bytes)
        if n <= 0:
            raise LLMException(f"cannot compute the size of shape {self._shape} with {self._data_type}")
        return n

    def update_dim(self, dim_index: int, dim_value: int) -> None:
        check_isinstance("dim_index", dim_index, int, allow_none=False)
        check_int64("dim_value", dim_value)
        if not 0 <= dim_index < len(self._shape):
            raise LLMException(f"dim_index {dim_index} is out of range", status_code=_PARAM_INVALID)
        self._shape[dim_index] = int(dim_value)

    def _to_kb(self) -> _kb.CacheDesc:
        return _kb.CacheDesc(self._num_tensors, _kb.DataType(int(self._data_type)), list(self._shape),
                             _kb.CachePlacement(int(self._placement)))

    def __repr__(self) -> str:
        return (f"CacheDesc(num_tensors={self._num_tensors}, shape={self._shape}, data_type={self._data_type}, "
                f"placement={self._placement})")


class Cache:
    """A cache returned by :class:`CacheManager` (do not construct directly)."""

    def __init__(self, cache_id: int, cache_desc: CacheDesc, tensor_addrs: List[int],
                 is_blocks_cache: bool = True, _native: Any = None) -> None:
        self._cache_id = cache_id
        self._cache_desc = cache_desc
        self._tensor_addrs = list(tensor_addrs)
        self._is_blocks_cache = is_blocks_cache
        self._native = _native

    @property
    def cache_id(self) -> int:
        return self._cache_id

    @property
    def cache_desc(self) -> CacheDesc:
        return self._cache_desc

    @property
    def tensor_addrs(self) -> List[int]:
        return list(self._tensor_addrs)

    @property
    def is_blocks_cache(self) -> bool:
        return self._is_blocks_cache

    @property
    def per_device_tensor_addrs(self) -> List[List[int]]:
        """CANN's per-device address lists: one device here, so ``[tensor_addrs]``."""
        return [list(self._tensor_addrs)]

    @staticmethod
    def create_cpu_cache(cache_desc: CacheDesc, addrs: List[int]) -> "Cache":
        """Wraps host memory (not registered); used by ``CacheManager.swap_blocks``."""
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_isinstance("addrs", addrs, (list, tuple), allow_none=False)
        if cache_desc.placement != Placement.HOST:
            raise LLMException("create_cpu_cache requires Placement.HOST", status_code=_PARAM_INVALID)
        if len(addrs) != cache_desc.num_tensors:
            raise LLMException(f"len(addrs) = {len(addrs)} != num_tensors = {cache_desc.num_tensors}",
                               status_code=_PARAM_INVALID)
        for a in addrs:
            check_uint64("addrs", a)
        return Cache(-1, cache_desc, list(addrs), True)

    def __repr__(self) -> str:
        return f"Cache(cache_id={self._cache_id}, {self._cache_desc!r}, is_blocks_cache={self._is_blocks_cache})"


class KvCache(Cache):
    """CANN's V1 cache type; kvblocks returns :class:`Cache` objects (V2 semantics)."""


def _parse_key_args(cls: str, names: Sequence[str], args: Tuple[Any, ...], kwargs: dict[str, Any],
                    aliases: dict[str, str]) -> dict[str, Any]:
    if len(args) + len(kwargs) > len(names):
        raise LLMException(f"{cls} takes at most {len(names)} params, got {len(args) + len(kwargs)}",
                           status_code=_PARAM_INVALID)
    vals: dict[str, Any] = dict(zip(names, args))
    for k, v in kwargs.items():
        name = aliases.get(k, k)
        if name not in names:
            raise LLMException(f"Unsupported param {k!r} for {cls}", status_code=_PARAM_INVALID)
        vals[name] = v
    if "cluster_id" not in vals:
        raise LLMException("Param prompt_cluster_id or cluster_id is required", status_code=_PARAM_INVALID)
    return vals


class CacheKey:
    """Names a peer cache by request: ``(cluster_id, req_id, model_id=0, prefix_id=2**64-1)``."""

    def __init__(self, *args: int, **kwargs: int) -> None:
        vals = _parse_key_args("CacheKey", ("cluster_id", "req_id", "model_id", "prefix_id"), args, kwargs,
                               {"prompt_cluster_id": "cluster_id"})
        if "req_id" not in vals:
            raise LLMException("Param req_id is required", status_code=_PARAM_INVALID)
        self._cluster_id = check_uint64("cluster_id", vals["cluster_id"])
        self._req_id = check_uint64("req_id", vals["req_id"])
        self._model_id = check_uint64("model_id", vals.get("model_id", 0))
        self._prefix_id = check_uint64("prefix_id", vals.get("prefix_id", _U64_MAX))

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def prompt_cluster_id(self) -> int:
        return self._cluster_id

    @property
    def req_id(self) -> int:
        return self._req_id

    @property
    def model_id(self) -> int:
        return self._model_id

    @property
    def prefix_id(self) -> int:
        return self._prefix_id

    def _key(self) -> int:
        """kvblocks' int64 tag for this key (see docs/compat.md)."""
        return (1 << 62) | ((self._req_id & 0x7FFFFFFF) << 31) | (self._model_id & 0x7FFFFFFF)

    def __repr__(self) -> str:
        return f"CacheKey(cluster_id={self._cluster_id}, req_id={self._req_id}, model_id={self._model_id})"


class CacheKeyByIdAndIndex:
    """Names a peer cache by its id: ``(cluster_id, cache_id, batch_index=0)``."""

    def __init__(self, cluster_id: int, cache_id: int, batch_index: int = 0) -> None:
        self._cluster_id = check_uint64("cluster_id", cluster_id)
        self._cache_id = check_int64("cache_id", cache_id)
        self._batch_index = check_uint32("batch_index", batch_index)

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def cache_id(self) -> int:
        return self._cache_id

    @property
    def batch_index(self) -> int:
        return self._batch_index

    def __repr__(self) -> str:
        return (f"CacheKeyByIdAndIndex(cluster_id={self._cluster_id}, cache_id={self._cache_id}, "
                f"batch_index={self._batch_index})")


class BlocksCacheKey:
    """Names a peer's blocks cache: ``(cluster_id, model_id=0)``; ``model_id`` tells apart
    several caches one peer registered."""

    def __init__(self, *args: int, **kwargs: int) -> None:
        vals = _parse_key_args("BlocksCacheKey", ("cluster_id", "model_id"), args, kwargs,
                               {"prompt_cluster_id": "cluster_id"})
        check_isinstance("cluster_id", vals["cluster_id"], int, allow_none=False)
        check_isinstance("model_id", vals.get("model_id", 0), int, allow_none=False)
        self._cluster_id = int(vals["cluster_id"])
        self._model_id = int(vals.get("model_id", 0))

    @property
    def cluster_id(self) -> int:
        return self._cluster_id

    @property
    def prompt_cluster_id(self) -> int:
        return self._cluster_id

    @property
    def model_id(self) -> int:
        return self._model_id

    def _key(self) -> int:
        return self._model_id & ((1 << 62) - 1)

    def __repr__(self) -> str:
        return f"BlocksCacheKey(cluster_id={self._cluster_id}, model_id={self._model_id})"


def _layer_range(name: str, r: Optional[range], required: bool) -> Optional[range]:
    """A half-open layer range with step 1 and ``0 <= start < stop`` (None unless required)."""
    if r is None:
        if required:
            raise TypeError(f"{name} must be a range, got None")
        return None
    if not isinstance(r, range):
        raise TypeError(f"{name} must be a range, got {type(r).__name__}")
    if r.step != 1 or not 0 <= r.start < r.stop:
        raise LLMException(f"{name} must have step 1 and 0 <= start < stop, got {r}", status_code=_PARAM_INVALID)
    return r


class TransferConfig:
    """One destination of :meth:`CacheManager.transfer_cache_async`: push the local layers of
    ``src_layer_range`` (None: all) at batch ``src_batch_index`` to raw addresses of cluster
    ``dst_cluster_id``; ``dst_addrs`` holds 2 addresses (K, V) per transferred layer, in order.

    Raises TypeError / ValueError for a wrong type or integer range, LLMException(LLM_PARAM_INVALID)
    for a range whose step is not 1 or that is not ``0 <= start < stop``.
    """

    def __init__(self, dst_cluster_id: int, dst_addrs: List[int], src_layer_range: Optional[range] = None,
                 src_batch_index: int = 0) -> None:
        self.dst_cluster_id = dst_cluster_id
        self.dst_addrs = dst_addrs
        self.src_layer_range = src_layer_range
        self.src_batch_index = src_batch_index
        self.dst_layer_range = None  # accepted and ignored, as CANN

    @property
    def dst_cluster_id(self) -> int:
        return self._dst_cluster_id

    @dst_cluster_id.setter
    def dst_cluster_id(self, v: int) -> None:
        self._dst_cluster_id = check_uint64("dst_cluster_id", v)

    @property
    def dst_addrs(self) -> List[int]:
        return self._dst_addrs

    @dst_addrs.setter
    def dst_addrs(self, v: List[int]) -> None:
        check_isinstance("dst_addrs", v, (list, tuple), allow_none=False)
        self._dst_addrs = [check_uint64("dst_addrs", a) for a in v]

    @property
    def src_layer_range(self) -> Optional[range]:
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, v: Optional[range]) -> None:
        self._src_layer_range = _layer_range("src_layer_range", v, False)

    @property
    def src_batch_index(self) -> int:
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, v: int) -> None:
        self._src_batch_index = check_uint32("src_batch_index", v)

    def __repr__(self) -> str:
        return (f"TransferConfig(dst_cluster_id={self._dst_cluster_id}, dst_addrs={self._dst_addrs}, "
                f"src_layer_range={self._src_layer_range}, src_batch_index={self._src_batch_index})")


class TransferWithCacheKeyConfig:
    """A destination of :meth:`CacheManager.transfer_cache_async` in remote-cache-accessible mode: the
    peer cache named by ``cache_key``; local layer ``src_layer_range[i]`` goes to remote layer
    ``dst_layer_range[i]``.

    Raises TypeError for a missing key or range, LLMException(LLM_PARAM_INVALID) for ranges of unequal
    length, a bad step or bounds, or a non-zero ``src_batch_index`` with a BlocksCacheKey.
    """

    def __init__(self, cache_key: Union["BlocksCacheKey", CacheKeyByIdAndIndex], src_layer_range: range,
                 dst_layer_range: range, src_batch_index: int = 0) -> None:
        check_isinstance("cache_key", cache_key, (BlocksCacheKey, CacheKeyByIdAndIndex), allow_none=False)
        _layer_range("src_layer_range", src_layer_range, True)
        _layer_range("dst_layer_range", dst_layer_range, True)
        if len(src_layer_range) != len(dst_layer_range):
            raise LLMException(f"src_layer_range {src_layer_range} and dst_layer_range {dst_layer_range} differ "
                               "in length", status_code=_PARAM_INVALID)
        self.cache_key = cache_key
        self.src_layer_range = src_layer_range
        self.dst_layer_range = dst_layer_range
        self.src_batch_index = src_batch_index
        self.dst_cluster_id = cache_key.cluster_id

    @property
    def cache_key(self) -> Union["BlocksCacheKey", CacheKeyByIdAndIndex]:
        return self._cache_key

    @cache_key.setter
    def cache_key(self, v: Union["BlocksCacheKey", CacheKeyByIdAndIndex]) -> None:
        check_isinstance("cache_key", v, (BlocksCacheKey, CacheKeyByIdAndIndex), allow_none=False)
        self._cache_key = v

    @property
    def src_layer_range(self) -> Optional[range]:
        return self._src_layer_range

    @src_layer_range.setter
    def src_layer_range(self, v: Optional[range]) -> None:
        self._src_layer_range = _layer_range("src_layer_range", v, False)

    @property
    def dst_layer_range(self) -> Optional[range]:
        return self._dst_layer_range

    @dst_layer_range.setter
    def dst_layer_range(self, v: Optional[range]) -> None:
        self._dst_layer_range = _layer_range("dst_layer_range", v, False)

    @property
    def src_batch_index(self) -> int:
        return self._src_batch_index

    @src_batch_index.setter
    def src_batch_index(self, v: int) -> None:
        v = check_uint32("src_batch_index", v)
        if v != 0 and isinstance(self._cache_key, BlocksCacheKey):
            raise LLMException("src_batch_index must be 0 with a BlocksCacheKey", status_code=_PARAM_INVALID)
        self._src_batch_index = v


class LayerSynchronizer(abc.ABC):
    """Subclass it for :meth:`CacheManager.transfer_cache_async`: ``synchronize_layer(l, None)`` is
    called on the task's worker thread before layer ``l`` is sent, and should return True once the
    layer is ready (False ends the task with LLM_PARAM_INVALID)."""

    @abc.abstractmethod
    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        ...


class CacheTask:
    """Result handle of :meth:`CacheManager.transfer_cache_async` (never built by users)."""

    def __init__(self, job: Any) -> None:
        self._job = job

    def get_results(self, timeout_in_millis: Optional[int] = None) -> List[Optional[LLMStatusCode]]:
        """Waits up to ``timeout_in_millis`` ms (None: until the task ends). Returns
        ``[LLM_TIMEOUT] * n`` while the task still runs (a later call can get the final answer), else
        one entry per config, in order: its code, or None when the task ended before it finished.

        Raises TypeError / ValueError for a timeout that is not a uint32.
        """
        if timeout_in_millis is not None:
            check_uint32("timeout_in_millis", timeout_in_millis)
        return self._job.results(timeout_in_millis)

    def synchronize(self, timeout_in_millis: Optional[int] = None) -> LLMStatusCode:
        """As :meth:`get_results`, reduced to one code: LLM_TIMEOUT while running, else the first result
        that is neither LLM_SUCCESS nor None, else LLM_SUCCESS.

        Raises TypeError / ValueError for a timeout that is not a uint32.
        """
        res = self.get_results(timeout_in_millis)
        if self._job.running():
            return LLMStatusCode.LLM_TIMEOUT
        for r in res:
            if r is not None and r != LLMStatusCode.LLM_SUCCESS:
                return r
        return LLMStatusCode.LLM_SUCCESS
