# SPDX-License-Identifier: Apache-2.0
# Asynchronous and batched blocks transfers (include/kvblocks/async.h). Submission converts and
# checks on the caller's thread exactly as the synchronous call; a runtime worker thread moves the
# bytes and completes the handle, without the GIL and without any Python thread.
from libc.math cimport ceil


cdef class TransferHandle:
    """One submitted transfer, returned by :meth:`LlmDataDist.pull_kv_blocks_async` and friends.

    Any thread may call :meth:`wait`, :meth:`done` or read :attr:`status`. Dropping the handle does
    not cancel the transfer: it still ends by its deadline (``llm.SyncKvCacheWaitTime`` counted from
    submission). Not constructible from Python.
    """
    cdef CTransferHandle _h
    cdef bytes _what
    cdef object _dd  # the engine stays alive while a handle to one of its transfers exists

    def __init__(self):
        raise TypeError("TransferHandle is returned by the *_async and *_batch methods of LlmDataDist")

    @staticmethod
    cdef TransferHandle _create(object dd, bytes what):
        cdef TransferHandle h = TransferHandle.__new__(TransferHandle)
        h._dd = dd
        h._what = what
        return h

    def wait(self, timeout=None):
        """Waits, with the GIL released, until the transfer is done; returns None on success.

        Once :meth:`wait` has returned or raised anything but the builtin :class:`TimeoutError`,
        the runtime has finished with the transfer's memory: no byte of the destination changes
        afterwards (a transfer that hit its own deadline included).

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most; None waits for the transfer's own deadline.

        Raises
        ------
        TimeoutError
            (the builtin, not :class:`LLMTimeoutError`) ``timeout`` passed first. The transfer is
            still in flight and may change its destination until :meth:`done`; wait again.
        ValueError
            ``timeout`` is negative.
        ParamInvalidError, CacheNotExistError, LinkError, LLMTimeoutError
            The transfer failed, as the synchronous call would have (same classes and messages):
            ``LLMTimeoutError`` when it did not complete within ``llm.SyncKvCacheWaitTime`` of its
            submission, ``CacheNotExistError`` when a cache was unregistered before it started.
        """
        cdef int64_t ms = -1
        if timeout is not None:
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
            ms = <int64_t>ceil(timeout * 1000.0)
        cdef Status st
        with nogil:
            st = self._h.Wait(ms)
        if st == LLM_WAIT_PROC_TIMEOUT and not self._h.Done():
            raise TimeoutError(f"{self._what.decode()}: still in flight after {timeout} s (the transfer was not "
                               "cancelled; wait again)")
        check_status(st, self._what)

    def done(self):
        """True once the transfer finished (successfully or not) and its memory is no longer touched."""
        return self._h.Done()

    @property
    def status(self):
        """None while in flight, then the transfer's :class:`Status` (``Status.LLM_SUCCESS`` on success)."""
        if not self._h.Done():
            return None
        return _status(self._h.GetStatus())

    def __repr__(self):
        st = self.status
        return f"<TransferHandle {self._what.decode()} {'in flight' if st is None else st.name if hasattr(st, 'name') else hex(st)}>"


cdef TransferHandle _pull_async(LlmDataDist self, CacheIndex src_index, object dst_cache, object src_blocks,
                                object dst_blocks, KvCacheExtParam ext_param):
    cdef vector[uint64_t] src, dst
    _as_blocks(src_blocks, src, "src_blocks")
    _as_blocks(dst_blocks, dst, "dst_blocks")
    cdef CCache c
    cdef uint64_t limit = UINT64_MAX_
    cdef uint32_t ntensors = 0
    c.cache_id = _cache_id(dst_cache)
    if isinstance(dst_cache, Cache):
        limit = (<Cache>dst_cache)._num_blocks
        ntensors = (<Cache>dst_cache).cache_desc.num_tensors
    cdef const CKvCacheExtParam* ext = &_DEFAULT_EXT._c if ext_param is None else &ext_param._c
    cdef TransferHandle h = TransferHandle._create(self, b"pull_kv_blocks")
    cdef Py_ssize_t bad
    cdef Status st
    with nogil:
        bad = _check_pairs(src, dst, True, limit)
        if bad == _OK:
            bad = _check_layers(ext, True, ntensors)
        st = ImplAccess.PullKvBlocksAsync(self._impl.get()[0], src_index._c, c, src, dst, ext[0], h._h)
    if st == LLM_PARAM_INVALID and bad != _OK:
        _raise_pairs(bad, src, dst, True, limit, "pull_kv_blocks")
    check_status(st, b"pull_kv_blocks")
    return h


cdef TransferHandle _push_async(LlmDataDist self, object src_cache, CacheIndex dst_index, object src_blocks,
                                object dst_blocks, KvCacheExtParam ext_param):
    cdef vector[uint64_t] src, dst
    _as_blocks(src_blocks, src, "src_blocks")
    _as_blocks(dst_blocks, dst, "dst_blocks")
    cdef CCache c
    cdef uint64_t limit = UINT64_MAX_
    _fill_src_cache(src_cache, c)
    if isinstance(src_cache, Cache):
        limit = (<Cache>src_cache)._num_blocks
    cdef const CKvCacheExtParam* ext = &_DEFAULT_EXT._c if ext_param is None else &ext_param._c
    cdef TransferHandle h = TransferHandle._create(self, b"push_kv_blocks")
    cdef Py_ssize_t bad
    cdef Status st
    with nogil:
        bad = _check_pairs(src, dst, False, limit)
        if bad == _OK:
            bad = _check_layers(ext, False, c.cache_desc.num_tensors)
        st = ImplAccess.PushKvBlocksAsync(self._impl.get()[0], c, dst_index._c, src, dst, ext[0], h._h)
    if st == LLM_PARAM_INVALID and bad != _OK:
        _raise_pairs(bad, src, dst, False, limit, "push_kv_blocks")
    check_status(st, b"push_kv_blocks")
    return h


_PULL_FIELDS = ("src_index", "dst_cache", "src_blocks", "dst_blocks", "ext_param")
_PUSH_FIELDS = ("src_cache", "dst_index", "src_blocks", "dst_blocks", "ext_param")


cdef tuple _request_args(object req, tuple fields, str name, Py_ssize_t i):
    """The five arguments of one batch request: a tuple/list of the positional arguments of the
    synchronous call, or a dict of its keyword arguments."""
    if isinstance(req, dict):
        unknown = set(req) - set(fields)
        if unknown:
            raise TypeError(f"{name}[{i}]: unexpected keys {sorted(unknown)}")
        missing = [f for f in fields[:4] if f not in req]
        if missing:
            raise TypeError(f"{name}[{i}]: missing {missing}")
        return tuple(req.get(f) for f in fields)
    if isinstance(req, (tuple, list)):
        if not 4 <= len(req) <= 5:
            raise TypeError(f"{name}[{i}] must have 4 or 5 items ({', '.join(fields)}), got {len(req)}")
        return tuple(req) + (None,) * (5 - len(req))
    raise TypeError(f"{name}[{i}] must be a tuple or a dict of the arguments of {name[:-6]}, "
                    f"got {type(req).__name__}")


cdef list _submit_batch(LlmDataDist self, object requests, bint pull):
    cdef str name = "pull_kv_blocks_batch" if pull else "push_kv_blocks_batch"
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"{name} takes a list of requests, got {type(requests).__name__}")
    cdef vector[CBlocksRequest] reqs
    reqs.resize(len(requests))
    cdef Py_ssize_t i
    cdef CBlocksRequest* r
    for i in range(len(requests)):
        a = _request_args(requests[i], _PULL_FIELDS if pull else _PUSH_FIELDS, name, i)
        r = &reqs[i]
        r.pull = pull
        idx = a[0] if pull else a[1]
        if not isinstance(idx, CacheIndex):
            raise TypeError(f"{name}[{i}]: {'src_index' if pull else 'dst_index'} must be a CacheIndex, "
                            f"got {type(idx).__name__}")
        r.remote = (<CacheIndex>idx)._c
        if pull:
            r.local.cache_id = _cache_id(a[1])
        else:
            _fill_src_cache(a[0], r.local)
        _as_blocks(a[2], r.src_blocks, f"{name}[{i}].src_blocks")
        _as_blocks(a[3], r.dst_blocks, f"{name}[{i}].dst_blocks")
        if a[4] is not None:
            r.ext = (<KvCacheExtParam?>a[4])._c
        else:
            r.ext = _DEFAULT_EXT._c
    cdef vector[CTransferHandle] out
    cdef size_t failed = 0
    cdef Status st
    with nogil:
        st = ImplAccess.SubmitBlocksBatch(self._impl.get()[0], reqs, out, failed)
    if st != LLM_SUCCESS:
        detail = LastErrorMessage().decode("utf-8", "replace")
        what = f"{name}[{failed}]" if reqs.size() else name
        raise _errors.exception_for(st, what, detail)
    cdef bytes what_b = b"pull_kv_blocks" if pull else b"push_kv_blocks"
    cdef list handles = []
    cdef TransferHandle h
    for i in range(<Py_ssize_t>out.size()):
        h = TransferHandle._create(self, what_b)
        h._h = out[i]
        handles.append(h)
    return handles


def wait_all(handles, timeout=None):
    """Waits for every handle (in order, GIL released); raises the first failure once all are done.

    Raises
    ------
    TimeoutError
        ``timeout`` (seconds, for the whole call) passed first; the unfinished transfers are still
        in flight.
    LLMException
        The first handle, in order, whose transfer failed (after every transfer finished).
    """
    import time
    end = None if timeout is None else time.monotonic() + timeout
    first = None
    for h in handles:
        try:
            (<TransferHandle?>h).wait(None if end is None else max(0.0, end - time.monotonic()))
        except _errors.LLMException as e:
            if first is None:
                first = e
    if first is not None:
        raise first


# ---------------------------------------------------------------- nogil entry points
cdef Status pull_blocks_async_nogil(CLlmDataDist* dd, uint64_t src_cluster_id, int64_t src_cache_id,
                                    int64_t dst_cache_id, const uint64_t* src_blocks, const uint64_t* dst_blocks,
                                    size_t n, int32_t src_first, int32_t src_last, int32_t dst_first,
                                    int32_t dst_last, uint8_t tensor_num_per_layer,
                                    CTransferHandle* out) noexcept nogil:
    cdef CCacheIndex idx
    idx.cluster_id = src_cluster_id
    idx.cache_id = src_cache_id
    idx.batch_index = 0
    cdef CCache c
    c.cache_id = dst_cache_id
    cdef CKvCacheExtParam ext
    ext.src_layer_range = c_pair[int32_t, int32_t](src_first, src_last)
    ext.dst_layer_range = c_pair[int32_t, int32_t](dst_first, dst_last)
    ext.tensor_num_per_layer = tensor_num_per_layer
    return PullBlocksAsyncRaw(dd[0], idx, c, src_blocks, dst_blocks, n, ext, out[0])


cdef Status push_blocks_async_nogil(CLlmDataDist* dd, int64_t src_cache_id, uint32_t src_num_tensors,
                                    uint64_t dst_cluster_id, int64_t dst_cache_id, const uint64_t* src_blocks,
                                    const uint64_t* dst_blocks, size_t n, int32_t src_first, int32_t src_last,
                                    int32_t dst_first, int32_t dst_last, uint8_t tensor_num_per_layer,
                                    CTransferHandle* out) noexcept nogil:
    cdef CCacheIndex idx
    idx.cluster_id = dst_cluster_id
    idx.cache_id = dst_cache_id
    idx.batch_index = 0
    cdef CCache c
    c.cache_id = src_cache_id
    c.cache_desc.num_tensors = src_num_tensors
    c.cache_desc.placement = CCachePlacement.kDevice
    cdef CKvCacheExtParam ext
    ext.src_layer_range = c_pair[int32_t, int32_t](src_first, src_last)
    ext.dst_layer_range = c_pair[int32_t, int32_t](dst_first, dst_last)
    ext.tensor_num_per_layer = tensor_num_per_layer
    return PushBlocksAsyncRaw(dd[0], c, idx, src_blocks, dst_blocks, n, ext, out[0])


cdef Status wait_transfer_nogil(const CTransferHandle* h, int64_t timeout_ms) noexcept nogil:
    return h.Wait(timeout_ms)
