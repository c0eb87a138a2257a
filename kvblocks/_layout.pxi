# SPDX-License-Identifier: Apache-2.0
# Layout transforms and prepared transfers (include/kvblocks/layout.h): a kvblocks extension. The
# runtime checks every rule before any byte moves; this layer only converts arguments.

cdef extern from "ext_shim.h" namespace "kvblocks" nogil:
    cdef cppclass CBlockLayout "kvblocks::BlockLayout":
        uint32_t tokens_per_block
        uint32_t kv_heads
        uint32_t head_size
        uint32_t elem_size
        c_bool hnd

    cdef cppclass CLayoutTransform "kvblocks::LayoutTransform":
        CBlockLayout src
        CBlockLayout dst
        uint32_t src_head_begin
        uint32_t dst_head_begin
        uint32_t num_heads

    cdef cppclass CPreparedTransfer "kvblocks::PreparedTransfer":
        c_bool Valid() noexcept

    cdef cppclass CPreparedInfo "kvblocks::PreparedInfo":
        uint64_t bytes
        uint64_t segments
        uint64_t pairs

    Status PrepareBlocksTransfer "kvblocks::ImplAccess::PrepareBlocksTransfer"(
        CLlmDataDist& dd, const CBlocksRequest& request, const CLayoutTransform* layout,
        CPreparedTransfer& out) noexcept
    Status ExecutePrepared "kvblocks::ImplAccess::ExecutePrepared"(CLlmDataDist& dd,
                                                                   const CPreparedTransfer& p) noexcept
    Status ExecutePreparedAsync "kvblocks::ImplAccess::ExecutePreparedAsync"(
        CLlmDataDist& dd, const CPreparedTransfer& p, CTransferHandle& out) noexcept
    CPreparedInfo DescribePrepared "kvblocks::ImplAccess::DescribePrepared"(const CPreparedTransfer& p) noexcept


_ORDERS = {"NHD": False, "HND": True}


class BlockLayout:
    """What one block of every tensor of a cache holds: ``tokens_per_block`` tokens of ``kv_heads``
    heads of ``head_size`` elements of ``elem_size`` bytes, in ``order`` "NHD" ([token, head, dim])
    or "HND" ([head, token, dim]). Its bytes must be the cache's block size exactly."""

    __slots__ = ("tokens_per_block", "kv_heads", "head_size", "elem_size", "order")

    def __init__(self, tokens_per_block, kv_heads, head_size, elem_size, order="NHD"):
        if order not in _ORDERS:
            raise ValueError(f"order must be 'NHD' or 'HND', got {order!r}")
        self.tokens_per_block = int(tokens_per_block)
        self.kv_heads = int(kv_heads)
        self.head_size = int(head_size)
        self.elem_size = int(elem_size)
        self.order = order

    @property
    def block_bytes(self):
        return self.tokens_per_block * self.kv_heads * self.head_size * self.elem_size

    def __repr__(self):
        return (f"BlockLayout({self.tokens_per_block}, {self.kv_heads}, {self.head_size}, {self.elem_size}, "
                f"{self.order!r})")


cdef int _fill_layout(object l, CBlockLayout& out, str name) except -1:
    if not isinstance(l, BlockLayout):
        raise TypeError(f"{name} must be a BlockLayout, got {type(l).__name__}")
    out.tokens_per_block = l.tokens_per_block
    out.kv_heads = l.kv_heads
    out.head_size = l.head_size
    out.elem_size = l.elem_size
    out.hnd = _ORDERS[l.order]
    return 0


cdef int _fill_transform(object src_layout, object dst_layout, object src_heads, object dst_heads,
                         CLayoutTransform& x) except -1:
    _fill_layout(src_layout, x.src, "src_layout")
    _fill_layout(dst_layout, x.dst, "dst_layout")
    a, b = (0, src_layout.kv_heads) if src_heads is None else src_heads
    c = 0 if dst_heads is None else dst_heads[0]
    if dst_heads is not None and dst_heads[1] - dst_heads[0] != b - a:
        raise ValueError(f"src_heads {tuple(src_heads)} and dst_heads {tuple(dst_heads)} differ in width")
    if not 0 <= a < b or c < 0:
        raise ValueError(f"head ranges must be [begin, end) with 0 <= begin < end, got {src_heads!r}, {dst_heads!r}")
    x.src_head_begin = a
    x.dst_head_begin = c
    x.num_heads = b - a
    return 0


cdef class PreparedTransfer:
    """A pull or push checked and planned once by :meth:`LlmDataDist.prepare_transfer`; each
    :meth:`execute` finds the caches and the link again, checks that the plan still fits them and
    moves the bytes under a fresh ``llm.SyncKvCacheWaitTime`` deadline. Executions of one prepared
    transfer run one at a time. Not constructible from Python."""
    cdef CPreparedTransfer _p
    cdef object _dd
    cdef bytes _what

    def __init__(self):
        raise TypeError("PreparedTransfer is returned by LlmDataDist.prepare_transfer")

    @property
    def bytes(self):
        """Bytes one execution moves."""
        return DescribePrepared(self._p).bytes

    @property
    def segments(self):
        """Byte ranges per tensor pair, after merging ranges contiguous on both sides."""
        return DescribePrepared(self._p).segments

    @property
    def pairs(self):
        """Tensor pairs."""
        return DescribePrepared(self._p).pairs

    def execute(self):
        """Moves the bytes (GIL released); raises as the synchronous pull/push would."""
        cdef LlmDataDist dd = self._dd
        cdef Status st
        with nogil:
            st = ExecutePrepared(dd._impl.get()[0], self._p)
        check_status(st, self._what)

    def execute_async(self):
        """Submits one execution and returns a :class:`TransferHandle` (the plan is copied)."""
        cdef LlmDataDist dd = self._dd
        cdef TransferHandle h = TransferHandle._create(dd, self._what)
        cdef Status st
        with nogil:
            st = ExecutePreparedAsync(dd._impl.get()[0], self._p, h._h)
        check_status(st, self._what)
        return h

    def __repr__(self):
        return f"<PreparedTransfer {self._what.decode()} {self.pairs} pairs x {self.segments} segments, {self.bytes} bytes>"


cdef PreparedTransfer _prepare(LlmDataDist self, bint pull, CacheIndex remote, object local_cache, object src_blocks,
                               object dst_blocks, KvCacheExtParam ext_param, object src_layout, object dst_layout,
                               object src_heads, object dst_heads):
    cdef CBlocksRequest r
    r.pull = pull
    r.remote = remote._c
    _as_blocks(src_blocks, r.src_blocks, "src_blocks")
    _as_blocks(dst_blocks, r.dst_blocks, "dst_blocks")
    if pull:
        r.local.cache_id = _cache_id(local_cache)
    else:
        _fill_src_cache(local_cache, r.local)
    r.ext = (_DEFAULT_EXT if ext_param is None else ext_param)._c
    cdef CLayoutTransform x
    cdef const CLayoutTransform* xp = NULL
    if src_layout is not None or dst_layout is not None:
        _fill_transform(src_layout, dst_layout, src_heads, dst_heads, x)
        xp = &x
    elif src_heads is not None or dst_heads is not None:
        raise ValueError("src_heads/dst_heads need src_layout and dst_layout")
    cdef PreparedTransfer p = PreparedTransfer.__new__(PreparedTransfer)
    p._dd = self
    p._what = b"pull_kv_blocks" if pull else b"push_kv_blocks"
    cdef Status st
    with nogil:
        st = PrepareBlocksTransfer(self._impl.get()[0], r, xp, p._p)
    check_status(st, p._what)
    return p
