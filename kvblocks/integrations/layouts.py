# SPDX-License-Identifier: Apache-2.0
"""An engine's per-layer KV tensors: described (:class:`Layout`), registered once as one kvblocks cache
(:func:`register`), and compared with another engine's layout field by field (:func:`diff`).

A layout is what a block-for-block copy needs both sides to agree on: the number of layers, the bytes of
one block of one layer, the data type, the per-block shape (for example ``[2, block_size, heads,
head_size]``) and the token block size. ``num_blocks`` may differ: each side has its own pool.

Differences a transform could bridge (unequal layouts) are for the layout-transform work: it registers a
check per field in :data:`TRANSFORMS`; :func:`diff` then marks those differences ``transformable``.
Until then every difference is a mismatch.
"""
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import kvblocks as kb

# Fields two engines must share for a block-for-block transfer (num_blocks is each side's own).
COMPARED = ("num_layers", "block_bytes", "dtype", "block_shape", "block_size", "extra")

# Hook for layout transforms: field -> check(ours, theirs) -> True when a transform can bridge them.
TRANSFORMS: Dict[str, Callable[[Any, Any], bool]] = {}

_KB_DTYPES = {
    "bfloat16": kb.DataType.DT_BF16, "float16": kb.DataType.DT_FLOAT16, "float32": kb.DataType.DT_FLOAT,
    "uint8": kb.DataType.DT_UINT8, "int8": kb.DataType.DT_INT8,
    "float8_e4m3fn": kb.DataType.DT_UINT8, "float8_e5m2": kb.DataType.DT_UINT8,  # moved as bytes
}


@dataclass(frozen=True)
class Layout:
    """Per-layer KV tensors of one engine: ``num_layers`` tensors of ``num_blocks`` blocks, each block of a
    layer one contiguous chunk of ``block_bytes`` bytes."""

    num_layers: int
    num_blocks: int
    block_bytes: int
    dtype: str  # e.g. "bfloat16" (no "torch." prefix)
    block_shape: Tuple[int, ...]  # shape of one block of one layer, in elements of dtype
    block_size: int = 0  # tokens per block (0: not a token-block cache)
    extra: Tuple[Tuple[str, Any], ...] = ()  # engine-specific fields both sides must share (sorted pairs)

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["block_shape"], d["extra"] = list(self.block_shape), dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Layout":
        """A layout from :meth:`to_dict` output, possibly a peer's: ValueError for anything malformed."""
        try:
            lay = cls(int(d["num_layers"]), int(d["num_blocks"]), int(d["block_bytes"]), str(d["dtype"]),
                      tuple(int(x) for x in d["block_shape"]), int(d.get("block_size", 0)),
                      tuple(sorted(dict(d.get("extra", {})).items())))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"malformed layout: {e}") from None
        if min(lay.num_layers, lay.num_blocks, lay.block_bytes) <= 0 or len(lay.block_shape) > 8:
            raise ValueError("malformed layout: sizes must be positive, block_shape at most 8 dims")
        return lay

    def digest(self) -> str:
        """A short hash of the compared fields (not num_blocks): equal digests, equal layouts."""
        d = {k: v for k, v in self.to_dict().items() if k in COMPARED}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def cache_desc(self) -> "kb.CacheDesc":
        """One kvblocks cache: tensor ``l`` is layer ``l`` seen as ``[num_blocks, block_bytes / itemsize]``."""
        if self.dtype not in _KB_DTYPES:
            raise ValueError(f"unsupported KV dtype {self.dtype}")
        per_block = 1
        for x in self.block_shape:
            per_block *= x
        return kb.CacheDesc(num_tensors=self.num_layers, data_type=_KB_DTYPES[self.dtype],
                            shape=[self.num_blocks, per_block])


@dataclass(frozen=True)
class Difference:
    """One field two layouts disagree on, and whether a registered transform can bridge it."""

    field: str
    ours: Any
    theirs: Any
    transformable: bool = False

    def __str__(self) -> str:
        how = "transformable" if self.transformable else "must match"
        return f"{self.field}: ours {self.ours!r}, theirs {self.theirs!r} ({how})"


def diff(ours: Layout, theirs: Layout) -> List[Difference]:
    """Every compared field that differs (empty: a block-for-block copy works as is)."""
    out = []
    for f in COMPARED:
        a, b = getattr(ours, f), getattr(theirs, f)
        if a != b:
            check = TRANSFORMS.get(f)
            out.append(Difference(f, a, b, bool(check is not None and check(a, b))))
    return out


def explain(diffs: Sequence[Difference]) -> str:
    return "; ".join(str(d) for d in diffs)


def check_remote_cache(layout: Layout, described: Dict[str, Any]) -> List[Difference]:
    """What the peer's cache (``Peers.describe_cache``: the runtime's view of its registration) says
    against ``layout``, the layout it claimed: layers and bytes per layer block."""
    out = []
    if described.get("num_tensors") != layout.num_layers:
        out.append(Difference("num_layers", layout.num_layers, described.get("num_tensors")))
    nb = described.get("num_blocks") or 0
    if nb and described.get("tensor_bytes") != nb * layout.block_bytes:
        out.append(Difference("block_bytes", layout.block_bytes, (described.get("tensor_bytes") or 0) // nb))
    return out


@dataclass
class Registration:
    """A layout registered once on one engine, under a cache key peers find it by."""

    layout: Layout
    cache: "kb.Cache"
    key: int
    addrs: List[int] = field(default_factory=list)


def register(dd: "kb.LlmDataDist", layout: Layout, addrs: Sequence[int], key: int = -1,
             keepalive: Any = None) -> Registration:
    """Registers the per-layer tensors at ``addrs`` (one per layer, each ``num_blocks * block_bytes``
    bytes, contiguous) as one kvblocks cache under ``key`` (-1: none), so one transfer moves a block of
    every layer. ``keepalive`` is held while the cache is registered."""
    if len(addrs) != layout.num_layers:
        raise ValueError(f"{len(addrs)} tensor addresses for {layout.num_layers} layers")
    desc = layout.cache_desc()
    if desc.block_bytes != layout.block_bytes:
        raise ValueError(f"block_shape {layout.block_shape} of {layout.dtype} is {desc.block_bytes} bytes, "
                         f"the layout says {layout.block_bytes}")
    cache = dd._add_cache(desc, list(addrs), 0, key, keepalive)
    return Registration(layout, cache, key, list(addrs))


def describe_arrays(arrays: Sequence[Any], block_size: int = 0, extra: Optional[Dict[str, Any]] = None,
                    ) -> Tuple[Layout, List[int]]:
    """(layout, addresses) of per-layer arrays ``[num_blocks, ...]`` (torch tensors or numpy arrays, all the
    same shape and dtype, C-contiguous, in host memory). ValueError says which layer breaks which rule."""
    if not arrays:
        raise ValueError("no KV tensors")
    a0 = arrays[0]
    shape, dtype = tuple(a0.shape), _dtype_name(a0)
    addrs = []
    for i, a in enumerate(arrays):
        if tuple(a.shape) != shape or _dtype_name(a) != dtype:
            raise ValueError(f"layer {i} is {tuple(a.shape)} {_dtype_name(a)}, layer 0 is {shape} {dtype}")
        addr, contiguous, host = _buffer_facts(a)
        if not host:
            raise ValueError(f"layer {i} is not in host memory: kvblocks moves host memory")
        if not contiguous:
            raise ValueError(f"layer {i} is not contiguous: a block of a layer must be one chunk")
        addrs.append(addr)
    itemsize = a0.element_size() if hasattr(a0, "element_size") else a0.itemsize
    per_block = 1
    for x in shape[1:]:
        per_block *= x
    lay = Layout(len(arrays), shape[0], per_block * itemsize, dtype, shape[1:], block_size,
                 tuple(sorted((extra or {}).items())))
    return lay, addrs


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("torch.", "")


def _buffer_facts(a: Any) -> Tuple[int, bool, bool]:
    if hasattr(a, "data_ptr"):  # torch
        return a.data_ptr(), a.is_contiguous(), a.device.type == "cpu"
    return a.ctypes.data, bool(a.flags["C_CONTIGUOUS"]), True
