# SPDX-License-Identifier: Apache-2.0
"""CANN's ``CacheManager.transfer_cache_async`` over kvblocks' layer-wise push.

The caller's thread runs CANN's checks; one worker thread then walks the layers in order, calls the
synchronizer before each and makes the layer ready on one native layer-wise push per config. The
push sends each ready layer on a runtime thread while the worker waits for the next layer, so the
transfer overlaps the caller's compute. Every piece of every layer is checked against both cache
tables when the push opens, before any byte moves.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import kvblocks as _kb
from kvblocks.llm_datadist._check import check_isinstance, check_uint64
from kvblocks.llm_datadist.configs import Placement
from kvblocks.llm_datadist.status import LLMException, LLMStatusCode, code_2_status
from kvblocks.llm_datadist.v2.llm_types import (
    BlocksCacheKey,
    Cache,
    CacheTask,
    LayerSynchronizer,
    TransferConfig,
    TransferWithCacheKeyConfig,
)

_OK = LLMStatusCode.LLM_SUCCESS
_PARAM_INVALID = LLMStatusCode.LLM_PARAM_INVALID
_Piece = Tuple[int, int, int, int, int, List[Tuple[int, int, int]]]


class _Failure(Exception):
    """A per-config failure that becomes that config's result."""

    def __init__(self, code: LLMStatusCode, msg: str = "") -> None:
        super().__init__(msg)
        self.code = code


def _invalid(msg: str) -> LLMException:
    return LLMException(msg, status_code=_PARAM_INVALID)


def _indices(name: str, v: Optional[Sequence[int]]) -> List[int]:
    if v is None:
        return []
    check_isinstance(name, v, (list, tuple), allow_none=False)
    return [check_uint64(name, x) for x in v]


def check_and_start(cm: Any, src_cache: Cache, layer_synchronizer: LayerSynchronizer,
                    transfer_configs: Sequence[Any], src_block_indices: Optional[Sequence[int]],
                    dst_block_indices: Optional[Sequence[int]], dst_block_memory_size: Optional[int]) -> CacheTask:
    """CANN's checks 1-8 (spec hixl.md 3.2), in order, then the worker thread."""
    check_isinstance("src_cache", src_cache, Cache, allow_none=False)
    if src_cache.cache_desc.placement == Placement.HOST:
        raise _invalid("transfer_cache_async needs a DEVICE src_cache")
    dst_idx = _indices("dst_block_indices", dst_block_indices)
    src_idx = _indices("src_block_indices", src_block_indices)
    if dst_block_memory_size is not None:
        check_uint64("dst_block_memory_size", dst_block_memory_size)
    if src_idx and (not dst_idx or len(dst_idx) != len(src_idx)):
        raise _invalid("src_block_indices needs dst_block_indices of the same length (blocks to cache is not "
                       "supported)")
    if not src_idx and dst_idx and dst_block_memory_size is None:
        raise _invalid("dst_block_indices with a contiguous source needs dst_block_memory_size")
    check_isinstance("layer_synchronizer", layer_synchronizer, LayerSynchronizer, allow_none=False)
    remote = cm._dd._remote_accessible
    want = TransferWithCacheKeyConfig if remote else TransferConfig
    check_isinstance("transfer_configs", transfer_configs, (list, tuple), allow_none=False)
    for c in transfer_configs:
        check_isinstance("transfer_configs", c, want, allow_none=False)
    if not dst_idx and dst_block_memory_size not in (None, 0):
        raise _invalid("dst_block_memory_size needs dst_block_indices")
    num_tensors = src_cache.cache_desc.num_tensors
    if num_tensors % 2:
        raise _invalid(f"src_cache has {num_tensors} tensors; transfer_cache_async needs 2 per layer")
    num_layers = num_tensors // 2
    for c in transfer_configs:
        if c.src_layer_range is None:
            c.src_layer_range = range(0, num_layers)
        r = c.src_layer_range
        if src_idx and c.src_batch_index != 0:
            raise _invalid("src_batch_index must be 0 with src_block_indices")
        if not 0 <= r.start < r.stop <= num_layers:
            raise _invalid(f"src_layer_range {r} does not fit the {num_layers} layers of src_cache")
        if isinstance(c, TransferConfig) and len(c.dst_addrs) != 2 * len(r):
            raise _invalid(f"dst_addrs has {len(c.dst_addrs)} addresses; {2 * len(r)} are needed (K and V of "
                           f"each layer of {r})")
    job = _Job(cm, src_cache, layer_synchronizer, list(transfer_configs), src_idx, dst_idx,
               dst_block_memory_size or 0, num_layers)
    job.start()
    return CacheTask(job)


class _Job:
    def __init__(self, cm: Any, src: Cache, sync: LayerSynchronizer, cfgs: List[Any], src_idx: List[int],
                 dst_idx: List[int], bms: int, num_layers: int) -> None:
        self._cm = cm
        self._src = src
        self._sync = sync
        self._cfgs = cfgs
        self._src_idx = src_idx
        self._dst_idx = dst_idx
        self._bms = bms
        self._num_layers = num_layers
        self._slots: Dict[int, LLMStatusCode] = {}  # per dst_cluster_id, as CANN
        self._pushes: Dict[int, Any] = {}
        self._thread = threading.Thread(target=self._main, name="transfer_cache_async", daemon=True)

    # -- CacheTask side ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def running(self) -> bool:
        return self._thread.is_alive()

    def results(self, timeout_ms: Optional[int]) -> List[Optional[LLMStatusCode]]:
        self._thread.join(None if timeout_ms is None else timeout_ms / 1000.0)
        if self._thread.is_alive():
            return [LLMStatusCode.LLM_TIMEOUT] * len(self._cfgs)
        return [self._slots.get(c.dst_cluster_id) for c in self._cfgs]

    # -- worker -----------------------------------------------------------------------------
    def _record(self, i: int, code: LLMStatusCode) -> None:
        self._slots[self._cfgs[i].dst_cluster_id] = code

    def _main(self) -> None:
        try:
            self._run()
        except BaseException:  # noqa: B036 - CANN's worker dies here; kvblocks records LLM_FAILED [KVB]
            self._end()
            for c in self._cfgs:
                self._slots.setdefault(c.dst_cluster_id, LLMStatusCode.LLM_FAILED)

    def _run(self) -> None:
        for i in range(len(self._cfgs)):
            try:
                self._pushes[i] = self._open(i)
            except _Failure as f:
                self._record(i, f.code)
                self._end()
                return
        for layer in range(self._num_layers):
            sel = [i for i, c in enumerate(self._cfgs) if layer in c.src_layer_range]
            if not sel:
                continue
            if self._failed():
                return
            if not self._sync.synchronize_layer(layer, None):
                for i in sel:
                    self._record(i, _PARAM_INVALID)
                self._end()
                return
            for i in sel:
                try:
                    self._pushes[i].layer_ready(layer - self._cfgs[i].src_layer_range.start)
                except _kb.LLMException as e:
                    self._record(i, code_2_status(int(e.status_code)))
                    self._end()
                    return
        for i, p in self._pushes.items():
            try:
                p.finish()
                self._record(i, _OK)
            except _kb.LLMException as e:
                self._record(i, code_2_status(int(e.status_code)))

    def _failed(self) -> bool:
        """A layer that failed on some config ends the job (as CANN's blocking per-layer call)."""
        for i, p in self._pushes.items():
            st = p.status
            if st is not None and st != 0:
                self._record(i, code_2_status(int(st)))
                self._end()
                return True
        return False

    def _end(self) -> None:
        """Lets the layers already made ready land, then closes every push; a config whose every
        layer landed counts as done."""
        for i, p in self._pushes.items():
            p.drain()
            if p.layers_sent == p.num_layers:
                self._slots.setdefault(self._cfgs[i].dst_cluster_id, _OK)
            p.abort()

    # -- building one config's push ---------------------------------------------------------
    def _open(self, i: int) -> Any:
        cfg = self._cfgs[i]
        eng = self._cm._dd._engine_or_none()
        if eng is None:
            raise _Failure(LLMStatusCode.LLM_FAILED, "not initialized")
        native = self._src._native
        if native is None:
            raise _Failure(LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
        try:
            pieces = self._pieces(eng, cfg)
            return eng._open_layer_push_pieces(native, cfg.dst_cluster_id, len(cfg.src_layer_range), pieces, True)
        except _kb.LLMException as e:
            raise _Failure(code_2_status(int(e.status_code)), str(e)) from e

    def _local(self) -> Tuple[int, int, int, int]:
        """(tensor bytes, stride, batch size, number of blocks) of the source."""
        desc = self._src.cache_desc
        size = desc.size
        if self._src.is_blocks_cache:
            nb = desc.shape[0]
            return size, size // nb, 1, nb
        return size, size // desc.batch_size, desc.batch_size, 0

    def _segments(self, cfg: Any, base: int, remote: Optional[Dict[str, Any]]) -> List[Tuple[int, int, int]]:
        """The byte ranges of one tensor of a layer (C2C, C2B or B2B), relative to the destination."""
        size, stride, batch, nblocks = self._local()
        bms = self._bms
        if self._src_idx:  # B2B
            if max(self._src_idx) >= nblocks:
                raise _Failure(_PARAM_INVALID, "src block index out of range")
            if bms not in (0, stride):
                raise _Failure(_PARAM_INVALID, "dst_block_memory_size differs from the src block size")
            if remote is not None and (max(self._dst_idx) >= max(remote["num_blocks"], 1)
                                       or remote["stride"] != stride):
                raise _Failure(_PARAM_INVALID, "dst blocks do not fit the remote cache")
            return _runs([(s * stride, base + d * stride) for s, d in zip(self._src_idx, self._dst_idx)], stride)
        start = cfg.src_batch_index * stride
        if not self._src.is_blocks_cache and cfg.src_batch_index >= batch:
            raise _Failure(_PARAM_INVALID, "src_batch_index out of range")
        if self._src.is_blocks_cache and cfg.src_batch_index != 0:
            raise _Failure(_PARAM_INVALID, "src_batch_index must be 0 for a blocks cache")
        if not self._dst_idx:  # C2C
            return [(start, base, stride)]
        if not 0 < bms < size:  # C2B
            raise _Failure(_PARAM_INVALID, f"dst_block_memory_size {bms} must be in (0, {size})")
        if len(self._dst_idx) > math.ceil(size / bms):
            raise _Failure(_PARAM_INVALID, "more dst blocks than chunks")
        if remote is not None and (max(self._dst_idx) >= max(remote["num_blocks"], 1) or remote["stride"] != bms):
            raise _Failure(_PARAM_INVALID, "dst blocks do not fit the remote cache")
        segs = []
        last = len(self._dst_idx) - 1
        for j, d in enumerate(self._dst_idx):
            n = size % bms if j == last and size % bms else bms
            off = start + j * bms
            if off + n > size:  # reading past the source tensor [KVB]
                raise _Failure(_PARAM_INVALID, f"chunk {j} reads past the end of the source tensor")
            segs.append((off, base + d * bms, n))
        return segs

    def _pieces(self, eng: Any, cfg: Any) -> List[_Piece]:
        r = cfg.src_layer_range
        out: List[_Piece] = []
        if isinstance(cfg, TransferConfig):
            segs = self._segments(cfg, 0, None)
            for j, layer in enumerate(r):
                for k in (0, 1):
                    out.append((j, 2 * layer + k, 0, 0, cfg.dst_addrs[2 * j + k], segs))
            return out
        key = cfg.cache_key
        if isinstance(key, BlocksCacheKey):
            cid, bi = self._cm._remote_id(key.cluster_id, key._key()), 0
            if cid < 0:
                eng._describe_remote_cache(key.cluster_id, -1)  # raises the engine's code (link, cache)
        else:
            cid, bi = key.cache_id, key.batch_index
        rc = eng._describe_remote_cache(key.cluster_id, cid)
        if not self._src_idx and not self._dst_idx and bi >= max(rc["batch_size"], 1):
            raise _Failure(_PARAM_INVALID, "dst batch index out of range for the remote cache")
        segs = self._segments(cfg, bi * rc["stride"] if not self._dst_idx else 0,
                              rc if self._dst_idx else None)
        for j, layer in enumerate(r):
            dl = cfg.dst_layer_range[j]  # kvblocks pairs by position [KVB]
            if 2 * dl + 1 >= rc["num_tensors"]:
                raise _Failure(_PARAM_INVALID, f"dst layer {dl} is out of range for the remote cache")
            for k in (0, 1):
                out.append((j, 2 * layer + k, cid, 2 * dl + k, 0, segs))
        return out


def _runs(pairs: List[Tuple[int, int]], stride: int) -> List[Tuple[int, int, int]]:
    """Merges consecutive (src, dst) block pairs into longer ranges."""
    out: List[Tuple[int, int, int]] = []
    for s, d in pairs:
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + stride)
        else:
            out.append((s, d, stride))
    return out
