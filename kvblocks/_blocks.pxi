# SPDX-License-Identifier: Apache-2.0
# Block-list conversion and validation. Conversion needs the GIL only for Python sequences;
# buffers (array('Q'), numpy) are read and checked without it.

cdef extern from *:
    """
    static const unsigned long long KVB_UINT64_MAX = 0xFFFFFFFFFFFFFFFFULL;
    """
    const uint64_t UINT64_MAX_ "KVB_UINT64_MAX"

# _check_pairs results: _OK, or one of the negative codes, or the index of the bad element.
cdef enum:
    _OK = -1
    _EMPTY = -2
    _LENGTH = -3
    _LAYERS = -4


cdef inline Py_ssize_t _check_layers(const CKvCacheExtParam* ext, bint pull, uint32_t num_tensors) noexcept nogil:
    """Layer-range -> tensor-index math of kvblocks/rules.h, run before the call for a clear error.

    `num_tensors` is the local cache's tensor count for pull and the caller's desc count for push;
    0 means unknown (a bare cache id was passed), in which case the runtime alone decides.
    """
    cdef c_bool explicit_range
    cdef CTensorSpan span
    if num_tensors == 0:
        return _OK
    if pull:
        if PullTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                          ext.dst_layer_range.second, ext.tensor_num_per_layer, num_tensors, &explicit_range,
                          &span) != RuleError.kOk:
            return _LAYERS
        return _OK
    if (PushRangesValid(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                        ext.dst_layer_range.second, num_tensors) != RuleError.kOk or
            ext.tensor_num_per_layer == 0):
        return _LAYERS
    return _OK


cdef inline Py_ssize_t _check_pairs_p(const uint64_t* src, size_t ns, const uint64_t* dst, size_t nd,
                                      bint local_is_dst, uint64_t limit) noexcept nogil:
    """Non-empty, equal lengths, and every local index (dst for pull, src for push) < limit.

    The bounds rule is the runtime's own (kvblocks/rules.h), so the layers cannot disagree.
    """
    if ns == 0:
        return _EMPTY
    if ns != nd:
        return _LENGTH
    cdef const uint64_t* p = dst if local_is_dst else src
    cdef size_t pos = FirstOutOfRange(p, ns, limit)
    return _OK if pos == ns else <Py_ssize_t>pos


cdef inline Py_ssize_t _check_pairs(const vector[uint64_t]& src, const vector[uint64_t]& dst,
                                    bint local_is_dst, uint64_t limit) noexcept nogil:
    return _check_pairs_p(src.data(), src.size(), dst.data(), dst.size(), local_is_dst, limit)


cdef object _raise_pairs_p(Py_ssize_t code, const uint64_t* src, size_t ns, const uint64_t* dst, size_t nd,
                           bint local_is_dst, uint64_t limit, str what):
    if code == _EMPTY:
        raise _errors.exception_for(LLM_PARAM_INVALID, what, "src_blocks is empty")
    if code == _LAYERS:
        raise _errors.exception_for(LLM_PARAM_INVALID, what, "invalid layer selection for this cache")
    if code == _LENGTH:
        raise _errors.exception_for(
            LLM_PARAM_INVALID, what, f"src_blocks and dst_blocks differ in length ({ns} vs {nd})")
    name = "dst_blocks" if local_is_dst else "src_blocks"
    value = dst[code] if local_is_dst else src[code]
    raise _errors.exception_for(
        LLM_PARAM_INVALID, what, f"{name}[{code}] = {value} is out of range for a cache of {limit} blocks")


cdef object _raise_pairs(Py_ssize_t code, const vector[uint64_t]& src, const vector[uint64_t]& dst,
                         bint local_is_dst, uint64_t limit, str what):
    _raise_pairs_p(code, src.data(), src.size(), dst.data(), dst.size(), local_is_dst, limit, what)


cdef int _as_blocks(object obj, vector[uint64_t]& out, str name) except -1:
    """Converts a block list into `out`; TypeError for non-integers, ValueError for negatives."""
    cdef Py_ssize_t i, n
    cdef object x
    if type(obj) is list or type(obj) is tuple:
        n = len(obj)
        out.resize(n)
        for i in range(n):
            x = obj[i]
            if type(x) is not int:
                if isinstance(x, (float, str, bytes)) or not hasattr(x, "__index__"):
                    raise TypeError(f"{name}[{i}] must be an int, got {type(x).__name__}")
                x = x.__index__()
            if x < 0:
                raise ValueError(f"{name}[{i}] = {x} is negative")
            out[i] = PyLong_AsUnsignedLongLong(x)
        return 0
    if isinstance(obj, (str, bytes, bytearray)) or not PyObject_CheckBuffer(obj):
        raise TypeError(f"{name} must be a list, tuple, array('Q') or integer ndarray, got {type(obj).__name__}")
    return _buffer_blocks(obj, out, name)


cdef extern from "Python.h":
    bint PyObject_CheckBuffer(object obj)


cdef inline int _int_kind(const char* fmt) noexcept nogil:
    """Kind of a buffer's struct format: 0 not a single integer, 1 unsigned, 2 signed."""
    if fmt == NULL:
        return 1  # no format means unsigned bytes
    while fmt[0] == b'@' or fmt[0] == b'=' or fmt[0] == b'<':
        fmt += 1
    if fmt[0] == 0 or fmt[1] != 0:
        return 0
    if fmt[0] in b"BHILQN":
        return 1
    if fmt[0] in b"bhilqn":
        return 2
    return 0


# Lists this long are converted and checked with the GIL released; shorter ones are not worth it.
cdef enum:
    _NOGIL_BLOCKS = 65536


cdef int _get_int_buffer(object obj, Py_buffer* view, bint* is_signed, str name) except -1:
    """Exports `obj` as a 1-D C-contiguous integer buffer (the caller releases it)."""
    PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
    cdef int kind = _int_kind(view.format)
    if view.ndim > 1 or kind == 0:
        fmt = view.format.decode() if view.format != NULL else "B"
        PyBuffer_Release(view)
        if kind == 0:
            raise TypeError(f"{name} must hold integers, got buffer format {fmt!r}")
        raise TypeError(f"{name} must be one-dimensional")
    is_signed[0] = kind == 2
    return 0


cdef int _buffer_blocks(object obj, vector[uint64_t]& out, str name) except -1:
    cdef Py_buffer view
    cdef bint is_signed
    _get_int_buffer(obj, &view, &is_signed, name)
    cdef Py_ssize_t n = view.len // view.itemsize, neg = -1
    try:
        if view.itemsize == 8:
            # One copy (assign does not zero-fill); the sign check then reads the copy.
            out.assign(<const uint64_t*>view.buf, <const uint64_t*>view.buf + n)
            if is_signed:
                if n >= _NOGIL_BLOCKS:
                    with nogil:
                        neg = _first_negative(out.data(), n)
                else:
                    neg = _first_negative(out.data(), n)
        else:
            out.resize(n)
            with nogil:
                neg = _widen(view.buf, view.itemsize, is_signed, n, out.data())
    finally:
        PyBuffer_Release(&view)
    if neg >= 0:
        raise ValueError(f"{name}[{neg}] is negative")
    return 0


cdef Py_ssize_t _first_negative(const uint64_t* v, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint64_t bad = 0
    for i in range(n):
        bad |= v[i]
    if (bad >> 63) == 0:
        return -1
    for i in range(n):
        if (v[i] >> 63) != 0:
            return i
    return -1


cdef Py_ssize_t _widen(const void* buf, Py_ssize_t itemsize, bint is_signed, Py_ssize_t n,
                       uint64_t* out) noexcept nogil:
    """Copies n integers of `itemsize` bytes into uint64; returns the first negative index or -1."""
    cdef Py_ssize_t i
    cdef int64_t bad = 0
    if itemsize == 8:
        memcpy(out, buf, n * 8)
        if is_signed:
            for i in range(n):
                bad |= <int64_t>out[i]
            if bad < 0:
                for i in range(n):
                    if <int64_t>out[i] < 0:
                        return i
        return -1
    for i in range(n):
        if itemsize == 4:
            if is_signed:
                if (<const int32_t*>buf)[i] < 0:
                    return i
                out[i] = <uint64_t>(<const int32_t*>buf)[i]
            else:
                out[i] = (<const uint32_t*>buf)[i]
        elif itemsize == 2:
            if is_signed:
                if (<const int16_t*>buf)[i] < 0:
                    return i
                out[i] = <uint64_t>(<const int16_t*>buf)[i]
            else:
                out[i] = (<const uint16_t*>buf)[i]
        else:
            if is_signed:
                if (<const int8_t*>buf)[i] < 0:
                    return i
                out[i] = <uint64_t>(<const int8_t*>buf)[i]
            else:
                out[i] = (<const uint8_t*>buf)[i]
    return -1


cdef int _blocks_view(object obj, Py_buffer* view, vector[uint64_t]& storage, const uint64_t** p,
                      size_t* n, str name) except -1:
    """Points `p` at the block ids: in place for 8-byte integer buffers, else converted into
    `storage`. Returns 1 when `view` is held and the caller must release it."""
    cdef bint is_signed
    cdef Py_ssize_t neg = -1
    if type(obj) is list or type(obj) is tuple:
        _as_blocks(obj, storage, name)
    else:
        if isinstance(obj, (str, bytes, bytearray)) or not PyObject_CheckBuffer(obj):
            raise TypeError(f"{name} must be a list, tuple, array('Q') or integer ndarray, got {type(obj).__name__}")
        _get_int_buffer(obj, view, &is_signed, name)
        if view.itemsize == 8:
            p[0] = <const uint64_t*>view.buf
            n[0] = view.len // 8
            if is_signed:
                with nogil:
                    neg = _first_negative(p[0], n[0])
                if neg >= 0:
                    PyBuffer_Release(view)
                    raise ValueError(f"{name}[{neg}] is negative")
            return 1
        PyBuffer_Release(view)
        _buffer_blocks(obj, storage, name)
    p[0] = storage.data()
    n[0] = storage.size()
    return 0


def validate_blocks(src_blocks, dst_blocks, uint64_t num_blocks):
    """Runs the transfer's block-list checks alone (no call): non-empty, equal lengths, and
    every ``dst_blocks`` index below ``num_blocks``. 8-byte integer buffers are checked in place.

    Raises
    ------
    TypeError, ValueError
        A list is not a sequence of non-negative integers.
    ParamInvalidError
        A check failed.
    """
    cdef vector[uint64_t] src_store, dst_store
    cdef Py_buffer src_view, dst_view
    cdef const uint64_t* sp = NULL
    cdef const uint64_t* dp = NULL
    cdef size_t ns = 0, nd = 0
    cdef Py_ssize_t bad
    cdef int held_src = 0, held_dst = 0
    try:
        held_src = _blocks_view(src_blocks, &src_view, src_store, &sp, &ns, "src_blocks")
        held_dst = _blocks_view(dst_blocks, &dst_view, dst_store, &dp, &nd, "dst_blocks")
        if nd >= _NOGIL_BLOCKS:
            with nogil:
                bad = _check_pairs_p(sp, ns, dp, nd, True, num_blocks)
        else:
            bad = _check_pairs_p(sp, ns, dp, nd, True, num_blocks)
        if bad != _OK:
            _raise_pairs_p(bad, sp, ns, dp, nd, True, num_blocks, "validate_blocks")
    finally:
        if held_src:
            PyBuffer_Release(&src_view)
        if held_dst:
            PyBuffer_Release(&dst_view)
