# SPDX-License-Identifier: Apache-2.0
# Layer-wise pushes (include/kvblocks/layerwise.h): opened once with every check of push_kv_blocks,
# told layer by layer that a layer is final (a nogil call that only queues it), finished under one
# deadline. A runtime thread sends each ready layer while the caller computes the next.


cdef class LayerPush:
    """An open layer-wise push, returned by :meth:`LlmDataDist.open_layer_push`.

    Call :meth:`layer_ready` as each layer of the source becomes final (layer ``l`` is tensors
    ``[l * tensor_num_per_layer, (l + 1) * tensor_num_per_layer)``), then :meth:`finish`. As a
    context manager it finishes on a normal exit and aborts when the block raises. Any thread may
    call any method. Dropping it unfinished aborts it. Not constructible from Python.
    """

    def __init__(self):
        raise TypeError("LayerPush is returned by LlmDataDist.open_layer_push")

    @property
    def num_layers(self):
        """Layers of the push (num_tensors // tensor_num_per_layer)."""
        return self._p.NumLayers()

    @property
    def layers_sent(self):
        """Layers that have landed so far."""
        return self._p.LayersSent()

    def layer_ready(self, uint32_t layer):
        """Layer ``layer`` of the source is final: queues it and returns at once (GIL released).

        Do not modify the layer's source blocks until :meth:`finish` has returned.

        Raises
        ------
        OverflowError, TypeError
            ``layer`` is not a non-negative integer.
        ParamInvalidError
            ``layer`` is out of range or was already made ready, or the push has finished.
        LLMException
            The push already failed (its status and reason, e.g. :class:`LLMTimeoutError`,
            :class:`LinkError`, :class:`CacheNotExistError`).
        """
        cdef Status st
        with nogil:
            st = self._p.LayerReady(layer)
        if st != LLM_SUCCESS:
            check_status(st, b"layer_ready")

    def finish(self, timeout=None):
        """Waits (GIL released) until every layer has landed; returns None on success.

        The deadline ``llm.SyncKvCacheWaitTime`` runs from :meth:`LlmDataDist.open_layer_push`.
        Once this returns or raises anything but the builtin :class:`TimeoutError`, no byte of the
        destination changes any more (after a deadline the layers not sent are abandoned).

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most (shorter than the deadline); None waits for the deadline.

        Raises
        ------
        TimeoutError
            (the builtin) ``timeout`` passed first; the push is still open: finish again.
        ValueError
            ``timeout`` is negative.
        LLMTimeoutError
            Not every layer landed within the deadline (layers not made ready count).
        ParamInvalidError, CacheNotExistError, LinkError, LLMException
            A layer failed as :meth:`LlmDataDist.push_kv_blocks` would have, or the push was
            aborted (``LLMException`` with LLM_FAILED).
        """
        cdef int64_t ms = -1
        if timeout is not None:
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
            ms = <int64_t>ceil(timeout * 1000.0)
        cdef Status st
        with nogil:
            st = self._p.Finish(ms)
        if st == LLM_WAIT_PROC_TIMEOUT and not self._p.Done():
            raise TimeoutError(f"layer-wise push: still open after {timeout} s ({self._p.LayersSent()} of "
                               f"{self._p.NumLayers()} layers sent); finish again")
        check_status(st, b"layer_wise_push")

    def abort(self):
        """Sends no more layers and returns once none is in flight (no later write to the destination).

        Returns the push's final :class:`Status` (``LLM_SUCCESS`` when every layer had already
        landed, else the failure, LLM_FAILED for an abort). Raises nothing.
        """
        cdef Status st
        with nogil:
            st = self._p.Abort()
        return _status(st)

    def drain(self):
        """Waits (GIL released) until the layers made ready so far have landed, or the push ended.
        The push stays open. Returns None while open, else its final :class:`Status`. Raises nothing."""
        cdef Status st
        with nogil:
            st = self._p.Drain()
        return None if st == LLM_WAIT_PROC_TIMEOUT else _status(st)

    def done(self):
        """True once the push ended (every layer landed, failed, or aborted) and nothing is in flight."""
        return self._p.Done()

    @property
    def status(self):
        """None while open, then the push's :class:`Status`."""
        if not self._p.Done():
            return None
        return _status(self._p.GetStatus())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
            return False
        self.finish()
        return False

    def __repr__(self):
        st = self.status
        return (f"<LayerPush {self._p.LayersSent()}/{self._p.NumLayers()} layers sent, "
                f"{'open' if st is None else getattr(st, 'name', st)}>")


cdef LayerPush _new_layer_push(object dd):
    cdef LayerPush p = LayerPush.__new__(LayerPush)
    p._dd = dd
    return p


cdef LayerPush _open_layer_push(LlmDataDist self, object src_cache, CacheIndex dst_index, object src_blocks,
                                object dst_blocks, object tensor_num_per_layer):
    cdef vector[uint64_t] src, dst
    _as_blocks(src_blocks, src, "src_blocks")
    _as_blocks(dst_blocks, dst, "dst_blocks")
    if isinstance(tensor_num_per_layer, bool) or not isinstance(tensor_num_per_layer, int):
        raise TypeError(f"tensor_num_per_layer must be an int, got {type(tensor_num_per_layer).__name__}")
    if not 1 <= tensor_num_per_layer <= 255:
        raise ValueError(f"tensor_num_per_layer must be in [1, 255], got {tensor_num_per_layer}")
    cdef uint8_t tnpl = tensor_num_per_layer
    cdef CCache c
    cdef uint64_t limit = UINT64_MAX_
    _fill_src_cache(src_cache, c)
    if isinstance(src_cache, Cache):
        limit = (<Cache>src_cache)._num_blocks
    cdef LayerPush p = _new_layer_push(self)
    cdef Py_ssize_t bad
    cdef Status st
    with nogil:
        bad = _check_pairs(src, dst, False, limit)
        st = ImplAccess.OpenLayerPush(self._impl.get()[0], c, dst_index._c, src, dst, tnpl, p._p)
    if st == LLM_PARAM_INVALID and bad != _OK:
        _raise_pairs(bad, src, dst, False, limit, "open_layer_push")
    check_status(st, b"open_layer_push")
    return p


cdef LayerPush _open_layer_push_pieces(LlmDataDist self, object src_cache, uint64_t dst_cluster_id,
                                       uint32_t num_layers, object pieces, bint per_layer_deadline):
    """pieces: (layer, src_tensor, dst_cache_id, dst_tensor, dst_addr, [(src_off, dst_off, len), ...])."""
    cdef CCache c
    _fill_src_cache(src_cache, c)
    cdef vector[CLayerPiece] ps
    cdef CLayerPiece pc
    cdef CLayerSegment sg
    for t in pieces:
        pc.layer, pc.src_tensor, pc.dst_cache_id, pc.dst_tensor, pc.dst_addr = t[0], t[1], t[2], t[3], t[4]
        pc.segs.clear()
        for seg in t[5]:
            sg.src_off, sg.dst_off, sg.len = seg
            pc.segs.push_back(sg)
        ps.push_back(pc)
    cdef LayerPush p = _new_layer_push(self)
    cdef Status st
    with nogil:
        st = ImplAccess.OpenLayerPushPieces(self._impl.get()[0], c, dst_cluster_id, num_layers, ps,
                                            per_layer_deadline, p._p)
    check_status(st, b"transfer_cache")
    return p


# ---------------------------------------------------------------- nogil entry points
cdef Status open_layer_push_nogil(CLlmDataDist* dd, int64_t src_cache_id, uint32_t src_num_tensors,
                                  uint64_t dst_cluster_id, int64_t dst_cache_id, const uint64_t* src_blocks,
                                  const uint64_t* dst_blocks, size_t n, uint8_t tensor_num_per_layer,
                                  CLayerPush* out) noexcept nogil:
    cdef CCacheIndex idx
    idx.cluster_id = dst_cluster_id
    idx.cache_id = dst_cache_id
    idx.batch_index = 0
    cdef CCache c
    c.cache_id = src_cache_id
    c.cache_desc.num_tensors = src_num_tensors
    c.cache_desc.placement = CCachePlacement.kDevice
    return OpenLayerPushRaw(dd[0], c, idx, src_blocks, dst_blocks, n, tensor_num_per_layer, out[0])


cdef Status layer_ready_nogil(CLayerPush* push, uint32_t layer) noexcept nogil:
    return push.LayerReady(layer)


cdef Status finish_layer_push_nogil(CLayerPush* push, int64_t timeout_ms) noexcept nogil:
    return push.Finish(timeout_ms)
