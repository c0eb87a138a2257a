# SPDX-License-Identifier: Apache-2.0
"""CANN's ``CacheManager`` (V2, cache-manager mode) over the kvblocks core."""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import kvblocks as _kb
from kvblocks import _lib
from kvblocks.llm_datadist._check import (
    check_int64,
    check_int_list,
    check_isinstance,
    check_uint32,
)
from kvblocks.llm_datadist.configs import DataType, MemInfo, Memtype, Placement
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode, engine_call
from kvblocks.llm_datadist.v2.llm_types import (
    BlocksCacheKey,
    Cache,
    CacheDesc,
    CacheKey,
    CacheKeyByIdAndIndex,
    CacheTask,
    LayerSynchronizer,
    TransferConfig,
    TransferWithCacheKeyConfig,
)
from kvblocks.llm_datadist.v2 import transfer_cache as _transfer_cache

if TYPE_CHECKING:
    from kvblocks.llm_datadist.v2.llm_datadist import LLMDataDist

__all__ = ["CacheManager"]

_PARAM_INVALID = LLMStatusCode.LLM_PARAM_INVALID
_U64_MAX = 2**64 - 1
_KIND_BLOCKS = 1
_KIND_CACHE = 2


def _invalid(msg: str) -> LLMException:
    return LLMException(msg, status_code=_PARAM_INVALID)


def _check_tnpl(tensor_num_per_layer: object) -> int:
    tnpl = check_uint32("tensor_num_per_layer", tensor_num_per_layer)
    if tnpl <= 0:
        raise _invalid("tensor_num_per_layer must be > 0")
    return tnpl


def _pull_range(name: str, r: Optional[range]) -> Tuple[int, int]:
    """Pull rule: a half-open range with step 1 and start >= 0 -> inclusive pair; None/empty -> all."""
    if r is None:
        return -1, -1
    check_isinstance(name, r, range, allow_none=False)
    if r.step != 1:
        raise _invalid(f"{name} step must be 1, got {r.step}")
    if r.start < 0:
        raise _invalid(f"{name} start must be >= 0, got {r.start}")
    if len(r) == 0:
        return -1, -1
    check_uint32(f"{name}.start", r.start)
    check_uint32(f"{name}.stop", r.stop - 1)
    return r.start, r.stop - 1


def _push_range(name: str, r: Optional[range], num_layers: int) -> range:
    if r is None:
        r = range(0, num_layers)
    check_isinstance(name, r, range, allow_none=False)
    if r.step != 1:
        raise _invalid(f"{name} step must be 1, got {r.step}")
    if not 0 <= r.start < r.stop:
        raise _invalid(f"{name} must satisfy 0 <= start < stop, got {r}")
    check_uint32(f"{name}.stop", r.stop - 1)
    return r


def _ext(src: Tuple[int, int], dst: Tuple[int, int], tnpl: int) -> _kb.KvCacheExtParam:
    if tnpl > 255:
        # The C++ struct holds a uint8; such a layer size cannot be addressed.
        raise _invalid(f"tensor_num_per_layer {tnpl} exceeds 255")
    return _kb.KvCacheExtParam(src, dst, tnpl)


class CacheManager:
    """Registers caches and moves blocks between linked peers. Obtained from
    :attr:`LLMDataDist.cache_manager`. Either role, and either side of a link, may pull and push."""

    def __init__(self, datadist: "LLMDataDist") -> None:
        self._dd = datadist
        # Keys this side bound: identity -> (cache id, batch index); cache id -> its identities.
        self._bound: Dict[Tuple[int, int, int], Tuple[int, int]] = {}
        self._cache_keys: Dict[int, List[Any]] = {}
        self._allocated: set = set()
        # Pulls by key (spec hixl.md 3.4): keys consumed here, and the tensors a key still owes.
        self._consumed: set = set()
        self._pending: Dict[Tuple[int, int], set] = {}

    # -- helpers ----------------------------------------------------------------------------
    def _engine(self, func: str, failed: LLMStatusCode = LLMStatusCode.LLM_FAILED) -> Any:
        eng = self._dd._engine_or_none()
        if eng is None:
            raise LLMException(f"[{func}] failed: llm datadist is not initialized", status_code=failed)
        return eng

    @staticmethod
    def _native(cache: Cache, func: str) -> Any:
        if cache._native is None:
            raise LLMException(f"[{func}] cache {cache.cache_id} is not registered with this LLMDataDist",
                               status_code=LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        return cache._native

    def _remote_id(self, cluster_id: int, key: int) -> int:
        """The peer's cache id tagged ``key``; -1 lets the engine report the failure in its order."""
        eng = self._dd._engine_or_none()
        if eng is None:
            return -1
        try:
            return int(eng._find_remote_cache(cluster_id, key))
        except _kb.LLMException:
            return -1

    def _add(self, func: str, desc: CacheDesc, addrs: Optional[List[int]], kind: int, key: int,
             keepalive: Any = None) -> Cache:
        eng = self._engine(func)
        with engine_call(func):
            native = eng._add_cache(desc._to_kb(), addrs, kind, key, keepalive)
        return Cache(int(native.cache_id), desc, [int(a) for a in native.tensor_addrs],
                     kind == _KIND_BLOCKS, native)

    # -- cache keys (spec hixl.md 3.4) -------------------------------------------------------
    @staticmethod
    def _identity(k: CacheKey) -> Optional[Tuple[int, int, int]]:
        """(kind, id, model_id) of a key; None for a placeholder (binds nothing)."""
        if k.prefix_id != _U64_MAX:
            return (1, k.prefix_id, k.model_id)
        if k.req_id == _U64_MAX:
            return None
        return (0, k.req_id, k.model_id)

    def _check_keys(self, desc: CacheDesc, cache_keys: Sequence[CacheKey]) -> None:
        if len(cache_keys) > (desc.shape[0] if desc.shape else 0):
            raise _invalid(f"{len(cache_keys)} cache_keys for shape[0] = {desc.shape[0] if desc.shape else 0}")
        seen = set()
        for k in cache_keys:
            ident = self._identity(k)
            if ident is None:
                continue  # placeholders may repeat [KVB]
            if ident in seen or ident in self._bound:
                raise _invalid(f"{k!r} is already bound to a cache")
            seen.add(ident)

    def _bind_keys(self, cache: Cache, cache_keys: Sequence[CacheKey]) -> None:
        if not cache_keys:
            return
        eng = self._engine("bind_keys")
        tags = [-1 if self._identity(k) is None else k._key() for k in cache_keys]
        with engine_call("register_cache"):
            eng._set_batch_keys(cache._native, tags)
        for b, k in enumerate(cache_keys):
            ident = self._identity(k)
            if ident is not None:
                self._bound[ident] = (cache.cache_id, b)
        self._cache_keys[cache.cache_id] = list(cache_keys)

    def _unbind_cache(self, cache_id: int) -> None:
        for k in self._cache_keys.pop(cache_id, []):
            self._bound.pop(self._identity(k), None)  # type: ignore[arg-type]

    def _source_row(self, key: Union[CacheKey, CacheKeyByIdAndIndex]) -> Tuple[int, int, Optional[Tuple[int, int]]]:
        """(remote cache id, batch index, release tag) of a pull by key; -1 lets the engine report a
        missing cache in its order. The tag names the key whose release rules apply (None: none)."""
        eng = self._dd._engine_or_none()
        if isinstance(key, CacheKeyByIdAndIndex):
            tag = None
            if eng is not None:
                try:
                    info = eng._describe_remote_cache(key.cluster_id, key.cache_id)
                    bk = info["batch_keys"]
                    if key.batch_index < len(bk) and bk[key.batch_index] >= 0:
                        tag = (key.cluster_id, int(bk[key.batch_index]))
                        if not info["allocated"]:
                            tag = None
                except _kb.LLMException:
                    pass
            if tag is not None and tag in self._consumed:
                return -1, 0, None
            return key.cache_id, key.batch_index, tag
        tag = (key.cluster_id, key._key())
        if eng is None or tag in self._consumed:
            return -1, 0, None
        try:
            cid, bi = eng._find_remote_key(key.cluster_id, key._key())
            info = eng._describe_remote_cache(key.cluster_id, cid)
        except _kb.LLMException:
            return -1, 0, None
        releasable = info["allocated"] and key.prefix_id == _U64_MAX
        return int(cid), int(bi), tag if releasable else None

    def _after_pull(self, tag: Optional[Tuple[int, int]], cid: int, src_layer_range: Optional[range],
                    tnpl: int) -> None:
        """A successful pull by a releasable key: its tensors are paid; the last one consumes it."""
        if tag is None:
            return
        eng = self._dd._engine_or_none()
        try:
            n = int(eng._describe_remote_cache(tag[0], cid)["num_tensors"]) if eng is not None else 0
        except _kb.LLMException:
            return
        pending = self._pending.setdefault(tag, set(range(n)))
        if src_layer_range is None or len(src_layer_range) == 0:
            pending.clear()
        else:
            pending.difference_update(range(src_layer_range.start * tnpl, src_layer_range.stop * tnpl))
        if not pending:
            self._pending.pop(tag, None)
            self._consumed.add(tag)
            try:  # the owner unbinds it for every puller, and frees a deferred cache with its last key
                if eng is not None:
                    eng._release_remote_key(tag[0], cid, tag[1])
            except _kb.LLMException:
                pass  # the link is gone: so is every other puller's view through it

    # -- registration -----------------------------------------------------------------------
    def register_cache(self, cache_desc: CacheDesc, addrs: List[int], cache_keys: Sequence[CacheKey] = (),
                       remote_accessible: Optional[bool] = None) -> Cache:
        """Registers user memory as a contiguous (batch) cache; ``cache_keys[0]`` tags it."""
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_int_list("addrs", addrs)
        check_isinstance("cache_keys", cache_keys, (list, tuple), allow_none=False)
        for k in cache_keys:
            check_isinstance("cache_keys", k, CacheKey, allow_none=False)
        check_isinstance("remote_accessible", remote_accessible, bool)
        if remote_accessible and self._dd._rank_linked:
            raise _invalid("remote_accessible=True is not allowed after LLMDataDist.link()")
        if len(addrs) == 0:
            raise _invalid("addrs is empty")
        if len(addrs) != cache_desc.num_tensors:
            raise _invalid(f"len(addrs) = {len(addrs)} != num_tensors = {cache_desc.num_tensors}")
        if any(a == 0 for a in addrs):
            raise _invalid("addrs contains 0")
        self._check_keys(cache_desc, cache_keys)
        key = cache_keys[0]._key() if cache_keys else -1
        cache = self._add("register_cache", cache_desc, list(addrs), _KIND_CACHE, key)
        self._bind_keys(cache, cache_keys)
        return cache

    def register_blocks_cache(self, cache_desc: CacheDesc, addrs: List[int],
                              blocks_cache_key: Optional[BlocksCacheKey] = None,
                              remote_accessible: Optional[bool] = None) -> Cache:
        """Registers user memory as a blocks cache; ``blocks_cache_key.model_id`` lets peers find it."""
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_int_list("addrs", addrs)
        check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        check_isinstance("remote_accessible", remote_accessible, bool)
        if remote_accessible and self._dd._rank_linked:
            raise _invalid("remote_accessible=True is not allowed after LLMDataDist.link()")
        key = blocks_cache_key._key() if blocks_cache_key is not None else -1
        return self._add("register_blocks_cache", cache_desc, list(addrs), _KIND_BLOCKS, key)

    def register_arrays(self, arrays: Sequence[Any], blocks_cache_key: Optional[BlocksCacheKey] = None,
                        placement: Placement = Placement.DEVICE) -> Cache:
        """Registers same-shape, same-dtype, C-contiguous writable buffers (numpy arrays,
        ``bytearray``/``mmap`` memoryviews, torch CPU tensors) as one blocks cache; the
        :class:`CacheDesc` is derived from them and the arrays are kept alive while registered.

        Raises TypeError for a wrong dtype, a non-contiguous layout or a read-only buffer.
        """
        check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        check_isinstance("placement", placement, Placement, allow_none=False)
        kdesc, addrs, keep = _lib._describe_arrays(arrays, _kb.CachePlacement(int(placement)))
        try:
            dt = DataType(int(kdesc.data_type))
        except ValueError:
            raise TypeError(f"arrays have element type {kdesc.data_type!r}, which llm_datadist's DataType "
                            "cannot describe") from None
        desc = CacheDesc(int(kdesc.num_tensors), list(kdesc.shape), dt, placement)
        key = blocks_cache_key._key() if blocks_cache_key is not None else -1
        return self._add("register_arrays", desc, addrs, _KIND_BLOCKS, key, keep)

    def unregister_cache(self, cache_id: int) -> None:
        check_int64("cache_id", cache_id)
        eng = self._engine("unregister_cache")
        with engine_call("unregister_cache"):
            eng.unregister_kv_cache(cache_id)
        self._unbind_cache(cache_id)

    # -- allocation -------------------------------------------------------------------------
    def allocate_cache(self, cache_desc: CacheDesc, cache_keys: Sequence[CacheKey] = ()) -> Cache:
        """Allocates a contiguous cache (memory owned by kvblocks)."""
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_isinstance("cache_keys", cache_keys, (list, tuple), allow_none=False)
        for k in cache_keys:
            check_isinstance("cache_keys", k, CacheKey, allow_none=False)
        if cache_desc.num_tensors <= 0:
            raise _invalid("num_tensors must be > 0")
        self._check_keys(cache_desc, cache_keys)
        key = cache_keys[0]._key() if cache_keys else -1
        cache = self._add("allocate_cache", cache_desc, None, _KIND_CACHE, key)
        self._allocated.add(cache.cache_id)
        self._bind_keys(cache, cache_keys)
        return cache

    def allocate_blocks_cache(self, cache_desc: CacheDesc, blocks_cache_key: Optional[BlocksCacheKey] = None) -> Cache:
        """Allocates a blocks cache (memory owned by kvblocks)."""
        check_isinstance("cache_desc", cache_desc, CacheDesc, allow_none=False)
        check_isinstance("blocks_cache_key", blocks_cache_key, BlocksCacheKey)
        if cache_desc.num_tensors <= 0:
            raise _invalid("num_tensors must be > 0")
        key = blocks_cache_key._key() if blocks_cache_key is not None else -1
        return self._add("allocate_blocks_cache", cache_desc, None, _KIND_BLOCKS, key)

    def _deallocate(self, func: str, cache: Cache, blocks: bool) -> None:
        check_isinstance("cache", cache, Cache, allow_none=False)
        if cache.is_blocks_cache != blocks:
            raise _invalid(f"{func} needs a {'blocks' if blocks else 'non-blocks'} cache")
        eng = self._engine(func, _PARAM_INVALID)
        with engine_call(func):
            deferred = eng._deallocate_when_unbound(cache.cache_id)
        if not deferred:  # else the keys stay bound (and pullable) until pulled or removed
            self._unbind_cache(cache.cache_id)

    def deallocate_cache(self, cache: Cache) -> None:
        """Frees an allocated cache. While keys of it are still bound the free is deferred (spec
        hixl.md 3.4): the memory stays valid and pullable until the last key is consumed by a
        peer's pull or removed with :meth:`remove_cache_key`; then it is freed and peers are told.

        Raises TypeError for a non-Cache; LLMException with LLM_PARAM_INVALID (a blocks cache, not
        initialized) or LLM_TIMEOUT (a same-host peer did not confirm it stopped using it)."""
        self._deallocate("deallocate_cache", cache, False)

    def deallocate_blocks_cache(self, cache: Cache) -> None:
        self._deallocate("deallocate_blocks_cache", cache, True)

    def remove_cache_key(self, cache_key: CacheKey) -> None:
        """Unbinds a key of an allocated cache (an unknown key, or a key of a registered cache, is a
        no-op, as CANN). Linked peers are told, so their pulls by it fail from then on; a cache whose
        deallocate was deferred is freed with its last key.

        Raises TypeError for a non-CacheKey, LLMException(LLM_FAILED) when not initialized."""
        check_isinstance("cache_key", cache_key, CacheKey, allow_none=False)
        eng = self._engine("remove_cache_key")
        ident = self._identity(cache_key)
        hit = self._bound.get(ident) if ident is not None else None  # type: ignore[arg-type]
        if hit is None:
            return
        cid, _ = hit
        if cid not in self._allocated:
            return  # registered-cache keys are never removed
        self._bound.pop(ident, None)  # type: ignore[arg-type]
        try:  # linked peers are told; a deferred deallocate completes with the last key
            eng._unbind_key(cid, cache_key._key())
        except _kb.LLMException:
            pass  # the cache is gone already

    # -- local copies -----------------------------------------------------------------------
    def copy_cache(self, dst: Cache, src: Cache, dst_batch_index: int = 0, src_batch_index: int = 0,
                   offset: int = 0, size: int = -1, req_id: Optional[int] = None) -> None:
        check_isinstance("dst", dst, Cache, allow_none=False)
        check_isinstance("src", src, Cache, allow_none=False)
        check_uint32("dst_batch_index", dst_batch_index)
        check_uint32("src_batch_index", src_batch_index)
        check_int64("offset", offset)
        check_int64("size", size)
        if src.is_blocks_cache or dst.is_blocks_cache:
            raise _invalid("copy_cache needs non-blocks caches")
        eng = self._engine("copy_cache", _PARAM_INVALID)
        with engine_call("copy_cache"):
            eng.copy_kv_cache(self._native(src, "copy_cache"), self._native(dst, "copy_cache"),
                              src_batch_index, dst_batch_index, offset, size)

    def copy_blocks(self, cache: Cache, copy_block_info: Dict[int, List[int]]) -> None:
        """Copies block ``src`` to each block of ``copy_block_info[src]`` inside ``cache``."""
        check_isinstance("cache", cache, Cache, allow_none=False)
        check_isinstance("copy_block_info", copy_block_info, dict, allow_none=False)
        if not cache.is_blocks_cache:
            raise _invalid("copy_blocks needs a blocks cache")
        for s, ds in copy_block_info.items():
            check_isinstance("copy_block_info key", s, int, allow_none=False)
            check_int_list("copy_block_info value", ds)
        eng = self._engine("copy_blocks", _PARAM_INVALID)
        native = self._native(cache, "copy_blocks")
        with engine_call("copy_blocks"):
            for s, ds in copy_block_info.items():
                if ds:
                    eng.copy_kv_blocks(native, native, [s], [[d] for d in ds])

    def swap_blocks(self, src_cache: Cache, dst_cache: Cache, src_to_dst: Dict[int, int]) -> None:
        """Copies blocks between a host (``Cache.create_cpu_cache``) and a device cache."""
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        check_isinstance("dst_cache", dst_cache, Cache, allow_none=False)
        check_isinstance("src_to_dst", src_to_dst, dict, allow_none=False)
        sd, dd = src_cache.cache_desc, dst_cache.cache_desc
        if not (src_cache.is_blocks_cache and dst_cache.is_blocks_cache):
            raise _invalid("swap_blocks needs two blocks caches")
        if sd.num_tensors != dd.num_tensors:
            raise _invalid("swap_blocks needs equal num_tensors")
        sbs, dbs = sd.size // sd.batch_size, dd.size // dd.batch_size
        if sbs != dbs:
            raise _invalid(f"block sizes differ ({sbs} vs {dbs})")
        if sd.placement == dd.placement:
            raise _invalid("swap_blocks supports host->device and device->host only")
        for s, d in src_to_dst.items():
            check_isinstance("src_to_dst", s, int, allow_none=False)
            check_isinstance("src_to_dst", d, int, allow_none=False)
            if not (0 <= s < sd.batch_size and 0 <= d < dd.batch_size):
                raise _invalid(f"block pair {s}->{d} is out of range")
        for sa, da in zip(src_cache.tensor_addrs, dst_cache.tensor_addrs):
            for s, d in src_to_dst.items():
                ctypes.memmove(da + d * dbs, sa + s * sbs, sbs)

    # -- transfers --------------------------------------------------------------------------
    def pull_blocks(self, src_cache_key: Union[CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey], dst_cache: Cache,
                    src_blocks: Union[List[int], Tuple[int, ...]] = (),
                    dst_blocks: Union[List[int], Tuple[int, ...]] = (),
                    src_layer_range: Optional[range] = None, dst_layer_range: Optional[range] = None,
                    tensor_num_per_layer: int = 2) -> None:
        """Pulls the peer's blocks ``src_blocks[i]`` into ``dst_blocks[i]`` of ``dst_cache``; with a
        ``CacheKey`` / ``CacheKeyByIdAndIndex`` source (``src_blocks`` empty), the peer's batch row is
        cut into chunks of one local block and chunk ``j`` lands in ``dst_blocks[j]`` (one runtime
        transfer). A successful pull by a request key of an allocated peer cache consumes the key
        (spec hixl.md 3.4; tracked on this side: a later pull by it raises LLM_KV_CACHE_NOT_EXIST).

        Layer ranges are half-open ``range`` objects (``range(a, b)`` = layers a..b-1); None = all.
        Safe to call from several threads at once.

        Raises TypeError / ValueError for wrong argument types or ranges; LLMException with
        LLM_PARAM_INVALID (bad lists, ranges, more chunks than the row holds), LLM_KV_CACHE_NOT_EXIST
        (no such peer cache or key, or the key was consumed), LLM_NOT_YET_LINK, LLM_TIMEOUT.
        """
        check_isinstance("src_cache_key", src_cache_key, (CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey),
                         allow_none=False)
        check_isinstance("dst_cache", dst_cache, Cache, allow_none=False)
        check_int_list("src_blocks", src_blocks)
        check_int_list("dst_blocks", dst_blocks)
        if not dst_cache.is_blocks_cache:
            raise _invalid("dst_cache must be a blocks cache")
        if len(dst_blocks) == 0:
            raise _invalid("dst_blocks is empty")
        tnpl = _check_tnpl(tensor_num_per_layer)
        if isinstance(src_cache_key, BlocksCacheKey):
            if len(src_blocks) == 0:
                raise _invalid("src_blocks is empty")
        else:
            if isinstance(src_cache_key, CacheKey):
                valid = [v not in (-1, 2**64 - 1) for v in (src_cache_key.req_id, src_cache_key.prefix_id)]
                if valid.count(True) != 1:
                    raise _invalid("exactly one of req_id and prefix_id must be set")
            if len(src_blocks) != 0:
                raise _invalid("src_blocks must be empty when pulling from a non-blocks cache")
        src_r = _pull_range("src_layer_range", src_layer_range)
        dst_r = _pull_range("dst_layer_range", dst_layer_range)
        ext = _ext(src_r, dst_r, tnpl)
        eng = self._engine("pull_blocks", _PARAM_INVALID)
        if not isinstance(src_cache_key, BlocksCacheKey):
            # contiguous -> blocks: the peer's batch row, cut into local blocks (one runtime transfer)
            cid, bi, tag = self._source_row(src_cache_key)
            with engine_call("pull_blocks"):
                eng._pull_row_to_blocks(_kb.CacheIndex(src_cache_key.cluster_id, cid, bi),
                                        self._native(dst_cache, "pull_blocks"), list(dst_blocks), ext)
            self._after_pull(tag, cid, src_layer_range, tnpl)
            return
        remote = self._remote_id(src_cache_key.cluster_id, src_cache_key._key())
        with engine_call("pull_blocks"):
            eng.pull_kv_blocks(_kb.CacheIndex(src_cache_key.cluster_id, remote, 0),
                               self._native(dst_cache, "pull_blocks"), list(src_blocks), list(dst_blocks), ext)

    def pull_cache(self, cache_key: Union[CacheKey, CacheKeyByIdAndIndex], cache: Cache, batch_index: int = 0,
                   size: int = -1, src_layer_range: Optional[range] = None,
                   dst_layer_range: Optional[range] = None, tensor_num_per_layer: int = 2) -> None:
        """Pulls the peer's batch row into row ``batch_index`` of a non-blocks ``cache``. A
        ``CacheKey`` names the row it was bound to (``cache_keys[i]`` -> batch ``i``); a pull by a
        request key of an allocated peer cache consumes it once every tensor was pulled (spec
        hixl.md 3.4, tracked on this side).

        Raises TypeError / ValueError for wrong argument types or ranges; LLMException with
        LLM_PARAM_INVALID, LLM_KV_CACHE_NOT_EXIST (unknown or consumed key), LLM_NOT_YET_LINK,
        LLM_TIMEOUT."""
        if self._dd._remote_accessible:
            check_isinstance("cache_key", cache_key, CacheKeyByIdAndIndex, allow_none=False)
        else:
            check_isinstance("cache_key", cache_key, (CacheKey, CacheKeyByIdAndIndex), allow_none=False)
        check_isinstance("cache", cache, Cache, allow_none=False)
        check_uint32("batch_index", batch_index)
        check_int64("size", size)
        if cache.is_blocks_cache:
            raise _invalid("pull_cache needs a non-blocks cache")
        if size != -1 and size <= 0:
            raise _invalid("size must be -1 or > 0")
        tnpl = _check_tnpl(tensor_num_per_layer)
        ext = _ext(_pull_range("src_layer_range", src_layer_range),
                   _pull_range("dst_layer_range", dst_layer_range), tnpl)
        eng = self._engine("pull_cache", _PARAM_INVALID)
        if self._dd._remote_accessible:  # the puller reads peer memory: no key is released [INFER]
            cid, bi, tag = cache_key.cache_id, cache_key.batch_index, None
        else:
            cid, bi, tag = self._source_row(cache_key)
        with engine_call("pull_cache"):
            eng.pull_kv_cache(_kb.CacheIndex(cache_key.cluster_id, cid, bi), self._native(cache, "pull_cache"),
                              batch_index, size, ext)
        self._after_pull(tag, cid, src_layer_range, tnpl)

    def _require_remote(self, func: str) -> None:
        if not self._dd._remote_accessible:
            raise _invalid(f"{func} needs enable_remote_cache_accessible (or local_comm_res) in the options")

    def push_blocks(self, dst_cache_key: BlocksCacheKey, src_cache: Cache,
                    src_blocks: Union[List[int], Tuple[int, ...]] = (),
                    dst_blocks: Union[List[int], Tuple[int, ...]] = (),
                    src_layer_range: Optional[range] = None, dst_layer_range: Optional[range] = None,
                    tensor_num_per_layer: int = 2) -> None:
        """Pushes local blocks ``src_blocks[i]`` into the peer's blocks ``dst_blocks[i]``, layer by layer."""
        self._require_remote("push_blocks")
        check_isinstance("dst_cache_key", dst_cache_key, BlocksCacheKey, allow_none=False)
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        check_int_list("src_blocks", src_blocks)
        check_int_list("dst_blocks", dst_blocks)
        if not src_cache.is_blocks_cache:
            raise _invalid("src_cache must be a blocks cache")
        if len(dst_blocks) == 0:
            raise _invalid("dst_blocks is empty")
        tnpl = _check_tnpl(tensor_num_per_layer)
        layers = src_cache.cache_desc.num_tensors // tnpl
        if src_layer_range is None and dst_layer_range is None and layers == 0:
            raise _invalid(f"tensor_num_per_layer {tnpl} exceeds num_tensors {src_cache.cache_desc.num_tensors}")
        src_r = _push_range("src_layer_range", src_layer_range, layers)
        dst_r = _push_range("dst_layer_range", dst_layer_range, layers)
        if len(src_r) != len(dst_r):
            raise _invalid(f"src_layer_range {src_r} and dst_layer_range {dst_r} differ in length")
        ext = _ext((src_r.start, src_r.stop - 1), (dst_r.start, dst_r.stop - 1), tnpl)
        eng = self._engine("push_blocks", _PARAM_INVALID)
        remote = self._remote_id(dst_cache_key.cluster_id, dst_cache_key._key())
        with engine_call("push_blocks"):
            eng.push_kv_blocks(self._native(src_cache, "push_blocks"),
                               _kb.CacheIndex(dst_cache_key.cluster_id, remote, 0),
                               list(src_blocks), list(dst_blocks), ext)

    def push_cache(self, dst_cache_key: CacheKeyByIdAndIndex, src_cache: Cache, src_batch_index: int = 0,
                   src_layer_range: Optional[range] = None, dst_layer_range: Optional[range] = None,
                   size: int = -1, tensor_num_per_layer: int = 2) -> None:
        """Pushes local batch row ``src_batch_index`` into the peer's row ``dst_cache_key.batch_index``."""
        self._require_remote("push_cache")
        check_isinstance("dst_cache_key", dst_cache_key, CacheKeyByIdAndIndex, allow_none=False)
        check_isinstance("src_cache", src_cache, Cache, allow_none=False)
        check_uint32("src_batch_index", src_batch_index)
        check_int64("size", size)
        if size != -1:
            raise _invalid("push_cache supports size -1 only")
        if src_cache.is_blocks_cache:
            raise _invalid("push_cache needs a non-blocks src_cache")
        tnpl = _check_tnpl(tensor_num_per_layer)
        layers = src_cache.cache_desc.num_tensors // tnpl
        if src_layer_range is None and dst_layer_range is None:
            src_p, dst_p = (-1, -1), (-1, -1)
        else:
            src_r = _push_range("src_layer_range", src_layer_range, layers)
            dst_r = _push_range("dst_layer_range", dst_layer_range, layers)
            if len(src_r) != len(dst_r):
                raise _invalid(f"src_layer_range {src_r} and dst_layer_range {dst_r} differ in length")
            src_p, dst_p = (src_r.start, src_r.stop - 1), (dst_r.start, dst_r.stop - 1)
        ext = _ext(src_p, dst_p, tnpl)
        eng = self._engine("push_cache", _PARAM_INVALID)
        with engine_call("push_cache"):
            eng.push_kv_cache(self._native(src_cache, "push_cache"),
                              _kb.CacheIndex(dst_cache_key.cluster_id, dst_cache_key.cache_id,
                                             dst_cache_key.batch_index),
                              src_batch_index, size, ext)

    # -- layer-wise push and remap ----------------------------------------------------------
    def transfer_cache_async(self, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
                             transfer_configs: Sequence[Union[TransferConfig, TransferWithCacheKeyConfig]],
                             src_block_indices: Optional[List[int]] = None,
                             dst_block_indices: Optional[List[int]] = None,
                             dst_block_memory_size: Optional[int] = None) -> CacheTask:
        """Pushes ``src_cache`` layer by layer to every config's peer, overlapped with the caller's
        compute, and returns a :class:`CacheTask` at once. A worker thread calls
        ``layer_synchronizer.synchronize_layer(l, None)`` before layer ``l`` is sent (False ends the
        task with LLM_PARAM_INVALID); each ready layer is sent by kvblocks' layer-wise push while the
        next one is awaited. Without indices a layer moves one batch row (block 0 of a blocks
        cache); ``dst_block_indices`` + ``dst_block_memory_size`` cut a contiguous row into blocks;
        both index lists move blocks. Per-layer failures are the task's results, not exceptions.

        Raises
        ------
        TypeError, ValueError
            A wrong argument type or integer range (a config type that does not match
            ``enable_remote_cache_accessible`` included).
        LLMException
            LLM_PARAM_INVALID for a HOST source, inconsistent index lists or block size, an odd
            tensor count, a layer range that does not fit, or a wrong number of ``dst_addrs``;
            LLM_FAILED when not initialized.
        """
        self._engine("transfer_cache_async")
        return _transfer_cache.check_and_start(self, src_cache, layer_synchronizer, transfer_configs,
                                               src_block_indices, dst_block_indices, dst_block_memory_size)

    def remap_registered_memory(self, mem_infos: Union[MemInfo, List[MemInfo]]) -> None:
        """CANN re-maps NIC registrations after a device-memory error (a reserved interface there).
        Host memory needs no remap: after CANN's checks this returns None when a link exists.

        Raises
        ------
        LLMException
            LLM_PARAM_INVALID when the argument is neither a MemInfo nor a list of them, a type is
            not MEM_TYPE_DEVICE, an addr is 0, a size <= 0, or the list is empty; LLM_NOT_YET_LINK
            without any link; LLM_FAILED when not initialized.
        """
        if isinstance(mem_infos, MemInfo):
            mem_infos = [mem_infos]
        if not isinstance(mem_infos, list):
            raise _invalid(f"mem_infos must be a MemInfo or a list of MemInfo, got {type(mem_infos).__name__}")
        for m in mem_infos:
            if not isinstance(m, MemInfo):
                raise _invalid(f"mem_infos must contain MemInfo, got {type(m).__name__}")
            if m.mem_type != Memtype.MEM_TYPE_DEVICE:
                raise _invalid(f"mem_type must be MEM_TYPE_DEVICE, got {m.mem_type}")
            if not m.addr:
                raise _invalid("addr must not be 0")
            if m.size is None or m.size <= 0:
                raise _invalid(f"size must be > 0, got {m.size}")
        eng = self._engine("remap_registered_memory")
        if not mem_infos:
            raise _invalid("mem_infos is empty")
        if not eng._has_links():
            raise LLMException("[remap_registered_memory] no link exists", status_code=LLMStatusCode.LLM_NOT_YET_LINK)
