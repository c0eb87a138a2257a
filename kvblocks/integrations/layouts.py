# SPDX-License-Identifier: Apache-2.0
"""An engine's per-layer KV tensors: described (:class:`Layout`), registered once as one kvblocks cache
(:func:`register`), and compared with another engine's layout field by field (:func:`diff`).

A layout is what a block-for-block copy needs both sides to agree on: the number of layers, the bytes of
one block of one layer, the data type, the per-block shape (for example ``[2, block_size, heads,
head_size]``) and the token block size. ``num_blocks`` may differ: each side has its own pool.

Unequal layouts: :func:`compatible` says whether kvblocks' layout transforms (README "Layout transforms")
can bridge two layouts and, when not, exactly which fields stop it; :func:`plan` turns a token range of
one request into the prepared transfers that move it (block-size ratios, head slices, partial blocks).
A transform needs both sides to describe the interior of a block (``extra["interior"]``, see
:data:`INTERIORS`); without it only equal layouts move (block for block). :data:`TRANSFORMS` is the
per-field hook of :func:`diff` for integrations with their own rules.
"""
import math
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


# ------------------------------------------------------------------ unequal layouts

# Block interiors kvblocks can transform (the value of ``extra["interior"]``; ``block_shape`` is then
# ``(kv_heads, 2, tokens, head_size)``).
INTERIORS = {
    # vLLM's CPU attention (layout LBHNC): its KV tensor [blocks, kv_heads, block_size, 2 * head_size]
    # holds, per head, K as [head_size, tokens] (tokens contiguous) and then V as [tokens, head_size]
    # (read back from cpu_attn_reshape_and_cache in tests/vllm/test_vllm_layouts.py).
    "vllm-cpu": "per KV head: K as [head_size, tokens], then V as [tokens, head_size]",
}
_MUST_MATCH = {
    "num_layers": "kvblocks maps layer l to layer l",
    "dtype": "kvblocks moves bytes, it converts no dtype",
}


@dataclass(frozen=True)
class KvGeometry:
    """What one block of one layer holds, for a ``vllm-cpu`` interior."""

    tokens: int
    heads: int
    head_size: int
    elem: int


def geometry(lay: Layout) -> Optional[KvGeometry]:
    """The block interior of ``lay`` when it is one kvblocks can transform (None otherwise). Raises nothing."""
    if dict(lay.extra).get("interior") not in INTERIORS or len(lay.block_shape) != 4:
        return None
    h, two, t, d = lay.block_shape
    per_block = h * two * t * d
    if two != 2 or t != lay.block_size or min(h, t, d) <= 0 or lay.block_bytes % per_block:
        return None
    return KvGeometry(t, h, d, lay.block_bytes // per_block)


# (source head begin, destination head begin, heads): KV heads of the source that land in the destination
HeadMap = Tuple[int, int, int]


@dataclass(frozen=True)
class Compat:
    """:func:`compatible`'s answer: ``same`` (a block-for-block copy), or a transform from ``src`` to
    ``dst`` geometry, or ``problems`` (why not, one line per field)."""

    same: bool
    src: Optional[KvGeometry] = None
    dst: Optional[KvGeometry] = None
    problems: Tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        return "; ".join(self.problems)


def compatible(ours: Layout, theirs: Layout, head_maps: Optional[Sequence[HeadMap]] = None) -> Compat:
    """Can kvblocks move ``theirs`` (the source's) blocks into ``ours``? Equal compared fields: yes, block
    for block. Otherwise, when both describe an interior kvblocks transforms (:data:`INTERIORS`) with the
    same layers, dtype, spec, head size and element size: yes, by a transform (any block sizes; KV heads
    as ``head_maps`` say, default all heads, which must then be equal). ``problems`` names every field
    that stops it and why. Raises nothing."""
    diffs = diff(ours, theirs)
    if not diffs:
        return Compat(True)
    problems = [f"{d.field}: ours {d.ours!r}, theirs {d.theirs!r} ({_MUST_MATCH[d.field]})"
                for d in diffs if d.field in _MUST_MATCH]
    x_ours, x_theirs = dict(ours.extra), dict(theirs.extra)
    for k in sorted(set(x_ours) | set(x_theirs)):
        if x_ours.get(k) != x_theirs.get(k):
            problems.append(f"{k}: ours {x_ours.get(k)!r}, theirs {x_theirs.get(k)!r} (must match)")
    shape = [d for d in diffs if d.field in ("block_bytes", "block_shape", "block_size")]
    gd, gs = geometry(ours), geometry(theirs)
    if not shape:
        return Compat(False, problems=tuple(problems))
    if gd is None or gs is None:
        problems.append(f"{explain(shape)}: a transform needs both sides to describe their block interior, "
                        f"one of {sorted(INTERIORS)} (interior: ours {x_ours.get('interior')!r}, theirs "
                        f"{x_theirs.get('interior')!r})")
        return Compat(False, problems=tuple(problems))
    if gd.head_size != gs.head_size:
        problems.append(f"head_size: ours {gd.head_size}, theirs {gs.head_size} (a head moves whole)")
    if gd.elem != gs.elem:
        problems.append(f"element size: ours {gd.elem}, theirs {gs.elem} (kvblocks converts no dtype)")
    problems += check_head_maps(gs, gd, head_maps)
    return Compat(False, gs, gd, tuple(problems))


def check_head_maps(src: KvGeometry, dst: KvGeometry, head_maps: Optional[Sequence[HeadMap]]) -> List[str]:
    """Why ``head_maps`` do not fit the two geometries (empty: they do; None: all heads, equal counts).
    Raises nothing."""
    if head_maps is None:
        if src.heads != dst.heads:
            return [f"kv heads: ours {dst.heads}, theirs {src.heads} (a head slice needs the tensor-parallel "
                    "ranks of both sides to say which heads go where)"]
        return []
    out = []
    for s, d, n in head_maps:
        if n <= 0 or s < 0 or d < 0 or s + n > src.heads or d + n > dst.heads:
            out.append(f"head map {s}+{n} -> {d}+{n} does not fit {src.heads} source and {dst.heads} "
                       "destination heads")
    return out


@dataclass(frozen=True)
class Piece:
    """One prepared transfer of a plan: arguments of ``LlmDataDist.prepare_transfer``."""

    src_blocks: Tuple[int, ...]
    dst_blocks: Tuple[int, ...]
    src_layout: "kb.BlockLayout"
    dst_layout: "kb.BlockLayout"
    src_heads: Tuple[int, int]
    dst_heads: Tuple[int, int]


def plan(src: KvGeometry, dst: KvGeometry, src_blocks: Sequence[int], dst_blocks: Sequence[int],
         start: int, stop: int, src_token0: int = 0, dst_token0: int = 0,
         head_maps: Optional[Sequence[HeadMap]] = None, sink: Optional[int] = None) -> List[Piece]:
    """The transfers moving tokens ``[start, stop)`` of one request from ``src_blocks`` (whose first holds
    tokens from ``src_token0``) into ``dst_blocks`` (from ``dst_token0``), heads as ``head_maps`` say
    (default: all, equal counts), for ``vllm-cpu`` interiors.

    K rows ``[head_size, tokens]`` are kvblocks' HND with ``2 * heads * head_size`` one-element heads
    and V ``[tokens, head_size]`` its HND with ``2 * heads`` heads, so a transform moves whole token
    groups where both block grids meet (``lcm`` of the block sizes): two transfers per KV head (K, V),
    block ratio included. A group reaching outside the request is completed on the source side with
    its first or last block (bytes that land only at tokens >= ``stop``, which the engine writes before
    it reads them) and on the destination side with ``sink``, a block the engine never reads (vLLM's
    null block); ``start`` must be at a destination block boundary. Raises ValueError when the range,
    the lists or the head maps do not fit, or a sink is needed and ``sink`` is None."""
    maps = list(head_maps) if head_maps is not None else [(0, 0, src.heads)]
    bad = check_head_maps(src, dst, head_maps)
    if bad:
        raise ValueError("; ".join(bad))
    ts, td = src.tokens, dst.tokens
    if src_token0 % ts or dst_token0 % td or start % td:
        raise ValueError(f"block lists and start must be at block boundaries (tokens {src_token0}, {dst_token0}, "
                         f"{start})")
    if not src_blocks or not (src_token0 <= start <= stop <= src_token0 + len(src_blocks) * ts
                              and dst_token0 <= start and stop <= dst_token0 + len(dst_blocks) * td):
        raise ValueError(f"tokens [{start}, {stop}) are not in both block lists (source from {src_token0}, "
                         f"{len(src_blocks)} x {ts}; destination from {dst_token0}, {len(dst_blocks)} x {td})")
    if stop == start:
        return []
    lcm = ts * td // math.gcd(ts, td)
    a0, a1 = start // lcm * lcm, -(-stop // lcm) * lcm
    sb = tuple(src_blocks[min(max((t - src_token0) // ts, 0), len(src_blocks) - 1)] for t in range(a0, a1, ts))
    db = []
    for t in range(a0, a1, td):
        j = (t - dst_token0) // td
        if t < start or j >= len(dst_blocks):
            if sink is None:
                raise ValueError(f"tokens [{start}, {stop}) do not fill whole groups of {lcm} tokens: a sink "
                                 "block is needed for the rest")
            db.append(sink)
        else:
            db.append(dst_blocks[j])
    e, dim = src.elem, src.head_size
    k_s = kb.BlockLayout(ts, 2 * src.heads * dim, 1, e, "HND")
    k_d = kb.BlockLayout(td, 2 * dst.heads * dim, 1, e, "HND")
    v_s = kb.BlockLayout(ts, 2 * src.heads, dim, e, "HND")
    v_d = kb.BlockLayout(td, 2 * dst.heads, dim, e, "HND")
    out = []
    for s, d, n in maps:
        for i in range(n):
            hs, hd = s + i, d + i
            out.append(Piece(sb, tuple(db), k_s, k_d, (2 * hs * dim, (2 * hs + 1) * dim),
                             (2 * hd * dim, (2 * hd + 1) * dim)))
            out.append(Piece(sb, tuple(db), v_s, v_d, (2 * hs + 1, 2 * hs + 2), (2 * hd + 1, 2 * hd + 2)))
    return out


# ------------------------------------------------------------------ unequal tensor parallelism


@dataclass(frozen=True)
class RankSource:
    """What one destination rank takes from one source rank: the source rank, the head maps (source
    rank's heads -> destination rank's heads; None: all heads, as they are) and how many destination
    ranks pull from that source rank (it frees a request's blocks after that many say done)."""

    rank: int
    head_maps: Optional[Tuple[HeadMap, ...]]
    pullers: int


def tp_sources(src_tp: int, src_heads: int, dst_tp: int, dst_rank: int, dst_heads: int,
               swap: bool = False) -> List[RankSource]:
    """The source ranks whose KV heads destination rank ``dst_rank`` holds, when KV heads are split
    evenly over the ranks of each side (rank r of a side with h heads per rank holds heads ``[r h,
    (r + 1) h)`` of the model): decode TP=1 takes heads [0, h/2) from prefill rank 0 and [h/2, h) from
    rank 1; decode TP=2 rank r takes its half from a TP=1 prefill. Equal TP: rank r from rank r, all
    heads. ``swap`` (tests only) mirrors the rank order of the side with more ranks: a deliberately
    wrong mapping. Raises ValueError when the two sides do not hold the same number of KV heads (vLLM
    replicates KV heads over ranks when TP exceeds them: not supported) or the sizes are not positive."""
    if min(src_tp, src_heads, dst_tp, dst_heads) <= 0 or not 0 <= dst_rank < dst_tp:
        raise ValueError(f"tensor parallelism {src_tp} x {src_heads} heads -> {dst_tp} x {dst_heads}, rank "
                         f"{dst_rank}: sizes must be positive and the rank below its TP size")
    total = src_tp * src_heads
    if total != dst_tp * dst_heads:
        raise ValueError(f"kv heads: ours {dst_heads} per rank x TP {dst_tp}, theirs {src_heads} x TP {src_tp}: "
                         "both sides must split the same KV heads (replicated KV heads are not supported)")
    if src_tp == dst_tp and not swap:
        return [RankSource(dst_rank, None, 1)]
    if swap and dst_tp > 1:
        dst_rank = dst_tp - 1 - dst_rank
    out = []
    d0, d1 = dst_rank * dst_heads, (dst_rank + 1) * dst_heads
    for r in range(src_tp):
        s0, s1 = r * src_heads, (r + 1) * src_heads
        lo, hi = max(s0, d0), min(s1, d1)
        if lo >= hi:
            continue
        pullers = sum(1 for q in range(dst_tp) if max(s0, q * dst_heads) < min(s1, (q + 1) * dst_heads))
        rank = src_tp - 1 - r if swap and dst_tp == 1 else r
        out.append(RankSource(rank, ((lo - s0, lo - d0, hi - lo),), pullers))
    return out
