# SPDX-License-Identifier: Apache-2.0
# distutils: language = c++
# cython: freethreading_compatible = False
"""kvblocks core: Cython bindings over the C++ runtime (llm_datadist::LlmDataDist).

Every transfer converts its block lists, validates them in ``nogil`` code and calls the runtime
with the GIL released. Failures raise through one helper, :func:`check_status`.
"""
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyObject_GetBuffer, PyBuffer_Release
from cpython.long cimport PyLong_AsUnsignedLongLong
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from libcpp cimport bool as c_bool
from libcpp.map cimport map as c_map
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string as c_string
from libcpp.utility cimport pair as c_pair
from libcpp.vector cimport vector

from kvblocks.includes.libkvblocks cimport *

import json as _json

from kvblocks import _errors
from kvblocks._errors import Status as _Status

include "_types.pxi"
include "_blocks.pxi"
include "_log.pxi"


cdef int check_status(Status st, const char* what) except -1 nogil:
    """Returns 0 on LLM_SUCCESS; otherwise takes the GIL and raises the mapped exception, with the
    runtime's reason for this thread's last call (``kvblocks::LastErrorMessage``)."""
    if st == LLM_SUCCESS:
        return 0
    cdef const char* detail = LastErrorMessage()
    with gil:
        raise _errors.exception_for(st, what.decode(), detail.decode("utf-8", "replace"))


cdef inline object _raise_param(str what, str detail):
    raise _errors.exception_for(LLM_PARAM_INVALID, what, detail)


cdef c_map[CAscendString, CAscendString] _options(object options) except *:
    cdef c_map[CAscendString, CAscendString] out
    if options is None:
        return out
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict[str, str], got {type(options).__name__}")
    for k, v in options.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("options must map str to str")
        out[CAscendString(k.encode())] = CAscendString(v.encode())
    return out


cdef CLlmRole _role(object role) except *:
    # kEnd (4) is declared by the C++ enum: it passes, and Initialize / SetRole reject it.
    cdef int32_t r = _enum_arg("role", role, LlmRole, (_ROLE_KEND,))
    return <CLlmRole>r


cdef int _cluster_vector(object clusters, vector[CClusterInfo]& out) except -1:
    if not isinstance(clusters, (list, tuple)):
        raise TypeError("clusters must be a list of ClusterInfo")
    cdef CClusterInfo ci
    cdef CIpInfo ip
    for c in clusters:
        if not isinstance(c, ClusterInfo):
            raise TypeError(f"clusters must contain ClusterInfo, got {type(c).__name__}")
        ci.remote_cluster_id = (<ClusterInfo>c).remote_cluster_id
        ci.remote_role_type = (<ClusterInfo>c).remote_role_type
        ci.local_ip_infos.clear()
        ci.remote_ip_infos.clear()
        for i in (<ClusterInfo>c).local_ip_infos:
            ip.ip = CAscendString((<IpInfo?>i).ip.encode())
            ip.port = (<IpInfo>i).port
            ci.local_ip_infos.push_back(ip)
        for i in (<ClusterInfo>c).remote_ip_infos:
            ip.ip = CAscendString((<IpInfo?>i).ip.encode())
            ip.port = (<IpInfo>i).port
            ci.remote_ip_infos.push_back(ip)
        out.push_back(ci)
    return 0


cdef inline int64_t _cache_id(object cache) except? -2:
    if isinstance(cache, Cache):
        return (<Cache>cache).cache_id
    if isinstance(cache, bool) or not isinstance(cache, int):
        raise TypeError(f"expected a Cache or a cache id, got {type(cache).__name__}")
    return cache


cdef class LlmDataDist:
    """One participant of disaggregated serving (CANN ``llm_datadist::LlmDataDist``).

    Parameters
    ----------
    cluster_id : int
        Unique id of this participant among everything it links to.
    role : LlmRole
        PROMPT, DECODER or MIX. As in CANN V2 any role may pull and push; with the option
        ``kvblocks.RoleCheck`` ``"1"`` (CANN V1) pulls need DECODER or MIX and pushes PROMPT or MIX.
    """

    def __cinit__(self, uint64_t cluster_id, role):
        self.cluster_id = cluster_id
        self._role = role
        self._keepalive = {}
        self._impl.reset(new CLlmDataDist(cluster_id, _role(role)))

    def __dealloc__(self):
        with nogil:
            self._impl.reset()

    cdef CLlmDataDist* native(self) except NULL:
        return self._impl.get()

    @property
    def role(self):
        """The current role."""
        return self._role

    def initialize(self, options):
        """Initializes from ``options`` (``dict[str, str]``); see the ``OPTION_*`` constants.

        Raises
        ------
        TypeError
            ``options`` is not a ``dict[str, str]``.
        ParamInvalidError
            A missing ``llm.DeviceId`` or a malformed option (``LLM_PARAM_INVALID``).
        LLMException
            The listener could not start (``LLM_FAILED``).
        """
        cdef c_map[CAscendString, CAscendString] opts = _options(options)
        cdef Status st
        with nogil:
            st = self._impl.get().Initialize(opts)
        _drain_logs()
        check_status(st, b"initialize")

    def finalize(self):
        """Tears down links, caches and threads; :meth:`initialize` may be called again."""
        with nogil:
            self._impl.get().Finalize()
        self._keepalive.clear()

    def set_role(self, role, options=None):
        """Switches role; ``llm.ListenIpInfo`` in ``options`` starts (or moves) the listener.

        Raises
        ------
        LinkError
            Links still exist (``LLM_EXIST_LINK``).
        ParamInvalidError
            Invalid role or listen address.
        """
        cdef CLlmRole r = _role(role)
        cdef c_map[CAscendString, CAscendString] opts = _options(options)
        cdef Status st
        with nogil:
            st = self._impl.get().SetRole(r, opts)
        _drain_logs()
        check_status(st, b"set_role")
        self._role = role

    def link_llm_clusters(self, clusters, int32_t timeout_in_millis=1000):
        """Links to each cluster over TCP; returns one status per cluster, in input order.

        A failed cluster does not raise: inspect the returned list (``0`` is success).

        Raises
        ------
        TypeError
            ``clusters`` is not a list of :class:`ClusterInfo`.
        ParamInvalidError
            Empty list, timeout <= 0, or a malformed IP address.
        LLMException
            Not initialized (``LLM_FAILED``).
        """
        cdef vector[CClusterInfo] cs
        _cluster_vector(clusters, cs)
        cdef vector[Status] rets
        cdef Status st
        with nogil:
            st = self._impl.get().LinkLlmClusters(cs, rets, timeout_in_millis)
        _drain_logs()
        if st != LLM_SUCCESS and rets.size() == 0:
            check_status(st, b"link_llm_clusters")
        return [_status(x) for x in rets]

    def unlink_llm_clusters(self, clusters, int32_t timeout_in_millis=1000, bint force=False):
        """Unlinks from each cluster; returns one status per cluster. ``force`` tears down locally.

        Raises
        ------
        TypeError
            ``clusters`` is not a list of :class:`ClusterInfo`.
        ParamInvalidError
            Empty list, timeout <= 0, or a malformed IP address.
        LLMException
            Not initialized (``LLM_FAILED``).
        """
        cdef vector[CClusterInfo] cs
        _cluster_vector(clusters, cs)
        cdef vector[Status] rets
        cdef Status st
        with nogil:
            st = self._impl.get().UnlinkLlmClusters(cs, rets, timeout_in_millis, force)
        if st != LLM_SUCCESS and rets.size() == 0:
            check_status(st, b"unlink_llm_clusters")
        return [_status(x) for x in rets]

    # ---------------------------------------------------------------- caches
    def allocate_cache(self, CacheDesc desc not None):
        """Allocates runtime-owned shared memory for ``desc``; returns the :class:`Cache`.

        Raises
        ------
        ParamInvalidError
            ``num_tensors`` is 0, or the shape or data type has no size.
        LLMOutOfMemoryError
            The memory could not be allocated.
        """
        return self._add_cache(desc, None, CCacheKind.kMix, -1, None)

    def register_kv_cache(self, CacheDesc desc not None, addrs):
        """Registers user memory: one address per tensor, each ``desc.tensor_bytes`` long.

        Raises
        ------
        ParamInvalidError
            Empty ``addrs``, a count other than ``num_tensors``, a zero address, or a bad shape.
        """
        if not isinstance(addrs, (list, tuple)):
            raise TypeError("addrs must be a list of int")
        return self._add_cache(desc, addrs, CCacheKind.kMix, -1, None)

    def register_arrays(self, arrays, *, placement=None):
        """Registers same-shape, same-dtype, C-contiguous writable buffers as one cache.

        ``arrays`` may hold numpy arrays, writable memoryviews (``bytearray``, ``mmap``) or torch
        CPU tensors. The :class:`CacheDesc` is derived from them; the arrays stay alive while the
        cache is registered.

        Raises
        ------
        TypeError
            An item is not a writable C-contiguous buffer, or the items differ in shape or dtype, or
            an item is device memory (``__cuda_array_interface__``, or a DLPack device other than the
            CPU): no backend serves CUDA memory here.
        ParamInvalidError
            The runtime rejected the cache.
        """
        desc, addrs, keep = _describe_arrays(arrays, placement)
        return self._add_cache(desc, addrs, CCacheKind.kMix, -1, keep)

    def _add_cache(self, CacheDesc desc, addrs, int kind, int64_t key, keepalive):
        if not <int>CCacheKind.kMix <= kind <= <int>CCacheKind.kCache:
            raise ValueError(f"kind={kind} is not a cache kind; valid values: 0 (mix), 1 (blocks), 2 (cache)")
        cdef CCacheDesc cd
        desc._to_c(cd)
        cdef vector[uint64_t] a
        if addrs is not None:
            for x in addrs:
                if isinstance(x, bool) or not isinstance(x, int):
                    raise TypeError("addresses must be int")
                if x < 0:
                    raise ValueError("addresses must be >= 0")
                a.push_back(x)
            if a.empty():
                _raise_param("register_kv_cache", "addrs is empty")
        cdef CCache out
        cdef Status st
        with nogil:
            st = ImplAccess.AddCache(self._impl.get()[0], cd, a, <CCacheKind>kind, key, out)
        check_status(st, b"allocate_cache" if addrs is None else b"register_kv_cache")
        if keepalive is not None:
            self._keepalive[out.cache_id] = keepalive
        pin = _Pin()
        if addrs is None:
            pin.p = ImplAccess.PinCacheMemory(self._impl.get()[0], out.cache_id)
        return Cache._create(out.cache_id, desc, [x for x in out.tensor_addrs], pin, keepalive,
                             kind != <int>CCacheKind.kCache)

    def deallocate_cache(self, cache):
        """Frees an allocated cache (a :class:`Cache` or its id). Unknown ids succeed.

        Views from :meth:`Cache.tensor` stay valid until released.
        """
        cdef int64_t cid = _cache_id(cache)
        cdef Status st
        with nogil:
            st = self._impl.get().DeallocateCache(cid)
        check_status(st, b"deallocate_cache")
        self._keepalive.pop(cid, None)

    def unregister_kv_cache(self, cache):
        """Unregisters a cache (a :class:`Cache` or its id). Unknown ids succeed.

        Raises
        ------
        LLMException
            Not initialized (``LLM_FAILED``).
        """
        cdef int64_t cid = _cache_id(cache)
        cdef Status st
        with nogil:
            st = self._impl.get().UnregisterKvCache(cid)
        check_status(st, b"unregister_kv_cache")
        self._keepalive.pop(cid, None)

    # ---------------------------------------------------------------- transfers
    def pull_kv_blocks(self, CacheIndex src_index not None, dst_cache, src_blocks, dst_blocks,
                       KvCacheExtParam ext_param=None):
        """Pulls remote blocks ``src_blocks[i]`` into local blocks ``dst_blocks[i]``.

        Block lists may be lists, tuples, ``array('Q')`` or numpy integer arrays.

        Raises
        ------
        TypeError, ValueError
            A block list is not a sequence of non-negative integers.
        ParamInvalidError
            Empty or unequal lists, an index out of range, a bad layer range, or the wrong role.
        CacheNotExistError
            The local or remote cache id is unknown.
        LinkError
            Not linked to ``src_index.cluster_id`` (``LLM_NOT_YET_LINK``) or the link broke.
        LLMTimeoutError
            The data did not land within ``llm.SyncKvCacheWaitTime``.
        """
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
        cdef Py_ssize_t bad
        cdef Status st
        with nogil:
            bad = _check_pairs(src, dst, True, limit)
            if bad == _OK:
                bad = _check_layers(ext, True, ntensors)
            # The runtime always decides the status, so Python and C++ answer alike even when
            # several arguments are wrong; the checks above only name the culprit.
            st = self._impl.get().PullKvBlocks(src_index._c, c, src, dst, ext[0])
        if st == LLM_PARAM_INVALID and bad != _OK:
            _raise_pairs(bad, src, dst, True, limit, "pull_kv_blocks")
        check_status(st, b"pull_kv_blocks")

    def push_kv_blocks(self, src_cache, CacheIndex dst_index not None, src_blocks, dst_blocks,
                       KvCacheExtParam ext_param=None):
        """Pushes local blocks ``src_blocks[i]`` into the peer's blocks ``dst_blocks[i]``.

        Every selected layer is validated before any byte moves, so a failed push changes
        nothing on the peer.

        Raises
        ------
        TypeError, ValueError
            A block list is not a sequence of non-negative integers.
        ParamInvalidError
            Empty or unequal lists, an index out of range, a bad layer range, or the wrong role.
        CacheNotExistError
            The local or remote cache id is unknown.
        LinkError
            Not linked to ``dst_index.cluster_id`` or the link broke.
        LLMTimeoutError
            The data did not land within ``llm.SyncKvCacheWaitTime``.
        """
        cdef vector[uint64_t] src, dst
        _as_blocks(src_blocks, src, "src_blocks")
        _as_blocks(dst_blocks, dst, "dst_blocks")
        cdef CCache c
        cdef uint64_t limit = UINT64_MAX_
        _fill_src_cache(src_cache, c)
        if isinstance(src_cache, Cache):
            limit = (<Cache>src_cache)._num_blocks
        cdef const CKvCacheExtParam* ext = &_DEFAULT_EXT._c if ext_param is None else &ext_param._c
        cdef Py_ssize_t bad
        cdef Status st
        with nogil:
            bad = _check_pairs(src, dst, False, limit)
            if bad == _OK:
                bad = _check_layers(ext, False, c.cache_desc.num_tensors)
            st = self._impl.get().PushKvBlocks(c, dst_index._c, src, dst, ext[0])
        if st == LLM_PARAM_INVALID and bad != _OK:
            _raise_pairs(bad, src, dst, False, limit, "push_kv_blocks")
        check_status(st, b"push_kv_blocks")

    def pull_kv_cache(self, CacheIndex src_index not None, dst_cache, uint32_t batch_index=0,
                      int64_t size=-1, KvCacheExtParam ext_param=None):
        """Pulls the peer's batch row ``src_index.batch_index`` into local row ``batch_index``.

        Raises
        ------
        ParamInvalidError, CacheNotExistError, LinkError, LLMTimeoutError
            As for :meth:`pull_kv_blocks`.
        """
        cdef CCache c
        c.cache_id = _cache_id(dst_cache)
        cdef const CKvCacheExtParam* ext = &_DEFAULT_EXT._c if ext_param is None else &ext_param._c
        cdef Status st
        with nogil:
            st = self._impl.get().PullKvCache(src_index._c, c, batch_index, size, ext[0])
        check_status(st, b"pull_kv_cache")

    def push_kv_cache(self, src_cache, CacheIndex dst_index not None, uint32_t src_batch_index=0,
                      int64_t size=-1, KvCacheExtParam ext_param=None):
        """Pushes local batch row ``src_batch_index`` to the peer's row ``dst_index.batch_index``.

        Raises
        ------
        ParamInvalidError, CacheNotExistError, LinkError, LLMTimeoutError
            As for :meth:`push_kv_blocks`.
        """
        cdef CCache c
        _fill_src_cache(src_cache, c)
        cdef const CKvCacheExtParam* ext = &_DEFAULT_EXT._c if ext_param is None else &ext_param._c
        cdef Status st
        with nogil:
            st = self._impl.get().PushKvCache(c, dst_index._c, src_batch_index, size, ext[0])
        check_status(st, b"push_kv_cache")

    def copy_kv_blocks(self, src_cache, dst_cache, src_blocks, dst_blocks_list):
        """Copies local blocks ``src_blocks`` into each list of ``dst_blocks_list`` (same process).

        Raises
        ------
        ParamInvalidError
            Empty lists, unequal lengths, indices out of range, or mismatched block sizes.
        CacheNotExistError
            A cache id is unknown.
        """
        cdef vector[uint64_t] src
        _as_blocks(src_blocks, src, "src_blocks")
        if not isinstance(dst_blocks_list, (list, tuple)):
            raise TypeError("dst_blocks_list must be a list of block lists")
        cdef vector[vector[uint64_t]] dsts
        cdef vector[uint64_t] one
        for lst in dst_blocks_list:
            _as_blocks(lst, one, "dst_blocks_list[i]")
            dsts.push_back(one)
        cdef CCache s, d
        _fill_src_cache(src_cache, s)
        d.cache_id = _cache_id(dst_cache)
        cdef Status st
        with nogil:
            st = self._impl.get().CopyKvBlocks(s, d, src, dsts)
        check_status(st, b"copy_kv_blocks")

    def copy_kv_cache(self, src_cache, dst_cache, uint32_t src_batch_index=0, uint32_t dst_batch_index=0,
                      uint64_t offset=0, int64_t size=-1):
        """Copies ``size`` bytes (-1: the rest of the row) of a batch row between local caches.

        Raises
        ------
        ParamInvalidError
            A batch index, offset or size out of range, or a host source cache.
        CacheNotExistError
            A cache id is unknown.
        """
        cdef CCache s, d
        _fill_src_cache(src_cache, s)
        d.cache_id = _cache_id(dst_cache)
        cdef Status st
        with nogil:
            st = self._impl.get().CopyKvCache(s, d, src_batch_index, dst_batch_index, offset, size)
        check_status(st, b"copy_kv_cache")

    # ---------------------------------------------------------------- asynchronous transfers
    def pull_kv_blocks_async(self, CacheIndex src_index not None, dst_cache, src_blocks, dst_blocks,
                             KvCacheExtParam ext_param=None):
        """Submits :meth:`pull_kv_blocks` and returns a :class:`TransferHandle` without waiting.

        Every check of the synchronous call runs here, with the same exceptions; the deadline
        (``llm.SyncKvCacheWaitTime``) counts from this call. Do not touch the destination blocks
        until :meth:`TransferHandle.wait` has returned.

        Raises
        ------
        TypeError, ValueError, ParamInvalidError, CacheNotExistError, LinkError
            As :meth:`pull_kv_blocks`, at submission; nothing moves.
        """
        return _pull_async(self, src_index, dst_cache, src_blocks, dst_blocks, ext_param)

    def push_kv_blocks_async(self, src_cache, CacheIndex dst_index not None, src_blocks, dst_blocks,
                             KvCacheExtParam ext_param=None):
        """Submits :meth:`push_kv_blocks` and returns a :class:`TransferHandle` without waiting.

        Do not modify the source blocks until :meth:`TransferHandle.wait` has returned.

        Raises
        ------
        TypeError, ValueError, ParamInvalidError, CacheNotExistError, LinkError
            As :meth:`push_kv_blocks`, at submission; nothing moves.
        """
        return _push_async(self, src_cache, dst_index, src_blocks, dst_blocks, ext_param)

    def prepare_transfer(self, CacheIndex remote not None, local_cache, src_blocks, dst_blocks, *, bint pull=True,
                         KvCacheExtParam ext_param=None, src_layout=None, dst_layout=None, src_heads=None,
                         dst_heads=None):
        """Checks and plans a pull (``remote`` -> ``local_cache``) or push (``local_cache`` -> ``remote``)
        once; returns a :class:`PreparedTransfer` to execute any number of times (a kvblocks extension).

        With ``src_layout`` and ``dst_layout`` (:class:`BlockLayout`) the transfer transforms: heads
        ``src_heads`` ``[a, b)`` of each source token land in ``dst_heads`` ``[c, c + b - a)``, the block
        lists (each in its side's own blocks) tile one token stream, NHD/HND are converted. Every
        check runs here, before any byte moves (README "Layout transforms").

        Raises
        ------
        TypeError, ValueError, ParamInvalidError, CacheNotExistError, LinkError
            As :meth:`pull_kv_blocks` / :meth:`push_kv_blocks`, and for a transform that breaks a rule.
        """
        return _prepare(self, pull, remote, local_cache, src_blocks, dst_blocks, ext_param, src_layout, dst_layout,
                        src_heads, dst_heads)

    def pull_kv_blocks_layout(self, CacheIndex src_index not None, dst_cache, src_blocks, dst_blocks, src_layout,
                              dst_layout, src_heads=None, dst_heads=None, KvCacheExtParam ext_param=None):
        """:meth:`pull_kv_blocks` between described layouts (see :meth:`prepare_transfer`)."""
        _prepare(self, True, src_index, dst_cache, src_blocks, dst_blocks, ext_param, src_layout, dst_layout,
                 src_heads, dst_heads).execute()

    def push_kv_blocks_layout(self, src_cache, CacheIndex dst_index not None, src_blocks, dst_blocks, src_layout,
                              dst_layout, src_heads=None, dst_heads=None, KvCacheExtParam ext_param=None):
        """:meth:`push_kv_blocks` between described layouts (see :meth:`prepare_transfer`)."""
        _prepare(self, False, dst_index, src_cache, src_blocks, dst_blocks, ext_param, src_layout, dst_layout,
                 src_heads, dst_heads).execute()

    def pull_kv_blocks_batch(self, requests):
        """Submits many pulls at once (possibly from different peers); returns one
        :class:`TransferHandle` per request, in order.

        Each request is a tuple ``(src_index, dst_cache, src_blocks, dst_blocks[, ext_param])`` or a
        dict of those keyword arguments. All requests are checked before any is submitted: one bad
        request raises and none moves.

        Raises
        ------
        TypeError, ValueError
            A request is malformed.
        ParamInvalidError, CacheNotExistError, LinkError
            A request fails a check of :meth:`pull_kv_blocks` (the message names its index), or
            ``requests`` is empty.
        """
        return _submit_batch(self, requests, True)

    def push_kv_blocks_batch(self, requests):
        """Submits many pushes at once; each request is ``(src_cache, dst_index, src_blocks,
        dst_blocks[, ext_param])`` or a dict of them. All-or-nothing as
        :meth:`pull_kv_blocks_batch`; returns one :class:`TransferHandle` per request.

        Raises
        ------
        TypeError, ValueError, ParamInvalidError, CacheNotExistError, LinkError
            As :meth:`pull_kv_blocks_batch`, with the checks of :meth:`push_kv_blocks`.
        """
        return _submit_batch(self, requests, False)

    # ---------------------------------------------------------------- layer-wise push
    def open_layer_push(self, src_cache, CacheIndex dst_index not None, src_blocks, dst_blocks,
                        tensor_num_per_layer=2):
        """Opens a layer-wise push of ``src_blocks[i]`` into the peer's ``dst_blocks[i]``: the
        arguments of :meth:`push_kv_blocks` without the layer ranges (layer ``l`` goes to remote
        layer ``l``). Returns a :class:`LayerPush`; call its ``layer_ready(l)`` as each layer is
        computed and ``finish()`` at the end. Each ready layer is sent while later layers are still
        being computed. The deadline ``llm.SyncKvCacheWaitTime`` covers all layers, from this call.

        Raises
        ------
        TypeError, ValueError
            A block list is not a sequence of non-negative integers, or ``tensor_num_per_layer``
            is not an int in [1, 255].
        ParamInvalidError
            As :meth:`push_kv_blocks`: empty or unequal lists, an index out of range, a tensor count
            ``tensor_num_per_layer`` does not divide, the wrong role or placement; nothing moves.
        CacheNotExistError
            The local or remote cache id is unknown.
        LinkError
            Not linked to ``dst_index.cluster_id``.
        """
        return _open_layer_push(self, src_cache, dst_index, src_blocks, dst_blocks, tensor_num_per_layer)

    def _open_layer_push_pieces(self, src_cache, uint64_t dst_cluster_id, uint32_t num_layers, pieces,
                                bint per_layer_deadline=False):
        return _open_layer_push_pieces(self, src_cache, dst_cluster_id, num_layers, pieces, per_layer_deadline)

    # ---------------------------------------------------------------- introspection
    def link_failure(self, uint64_t cluster_id):
        """Why the last :meth:`link_llm_clusters` to ``cluster_id`` failed, as a :class:`LinkFailure`
        ``(reason, status, message)``, or ``None`` when it succeeded or none was made. ``reason`` is
        one of :data:`LINK_FAILURE_REASONS` (``"refused"``, ``"unreachable"``, ``"timed_out"``,
        ``"auth_refused"``, ``"wrong_cluster_id"``, ``"version_mismatch"``, ``"limit_exceeded"``,
        ``"already_linked"``, ``"other"``); ``status`` is the status that call returned for the cluster."""
        cdef CLinkFailure f
        if not ImplAccess.LastLinkFailure(self._impl.get()[0], cluster_id, f):
            return None
        return LinkFailure(ImplAccess.LinkFailureReasonName(f.reason).decode(), _status(f.status),
                           f.message.decode("utf-8", "replace"))

    @property
    def listen_address(self):
        """``"ip:port"`` (``"[ip6]:port"``) the listener is bound to, with the port the kernel chose
        for ``llm.ListenIpInfo`` ``ip:0``; ``None`` when this engine does not listen."""
        cdef c_string a = ImplAccess.ListenAddress(self._impl.get()[0])
        return a.decode() if a.size() else None

    def link_path(self, uint64_t cluster_id):
        """Data path towards a linked peer: ``"inprocess"``, ``"shm"``, ``"cma"``, ``"shm+cma"``,
        ``"tcp"``, or ``""`` when not linked."""
        return ImplAccess.LinkPath(self._impl.get()[0], cluster_id).decode()

    def _set_batch_keys(self, cache, keys):
        cdef vector[int64_t] ks = keys
        cdef Status st = ImplAccess.SetBatchKeys(self._impl.get()[0], _cache_id(cache), ks)
        check_status(st, b"set_batch_keys")

    def _find_remote_key(self, uint64_t cluster_id, int64_t key):
        """(cache id, batch index) of the peer's cache row bound to ``key``. Raises LinkError /
        CacheNotExistError."""
        cdef int64_t cid = -1
        cdef uint32_t bi = 0
        cdef Status st
        with nogil:  # may ask the peer (a key bound after linking)
            st = ImplAccess.FindRemoteKey(self._impl.get()[0], cluster_id, key, cid, bi)
        check_status(st, b"find_remote_key")
        return cid, bi

    def _deallocate_when_unbound(self, cache):
        """Frees an allocated cache now, or once its last batch key is released (spec hixl.md 3.4);
        True when deferred. Raises LLMException (not initialized, LLM_TIMEOUT as deallocate_cache)."""
        cdef int64_t cid = _cache_id(cache)
        cdef c_bool deferred = False
        cdef Status st
        with nogil:
            st = ImplAccess.DeallocateWhenUnbound(self._impl.get()[0], cid, deferred)
        check_status(st, b"deallocate_cache")
        if not deferred:
            self._keepalive.pop(cid, None)
        return bool(deferred)

    def _unbind_key(self, cache, int64_t key):
        """Unbinds ``key`` from a local cache (frees it when a deferred deallocate waited for its
        last key); True when it was bound. Raises CacheNotExistError for an unknown cache."""
        cdef int64_t cid = _cache_id(cache)
        cdef c_bool was = False
        cdef Status st
        with nogil:
            st = ImplAccess.UnbindKey(self._impl.get()[0], cid, key, was)
        check_status(st, b"remove_cache_key")
        return bool(was)

    def _release_remote_key(self, uint64_t cluster_id, int64_t cache_id, int64_t key):
        """This engine consumed ``key`` of the peer's cache: later pulls by it fail here and the
        owner unbinds it. Raises LinkError / CacheNotExistError."""
        cdef Status st = ImplAccess.ReleaseRemoteKey(self._impl.get()[0], cluster_id, cache_id, key)
        check_status(st, b"release_key")

    def _pull_row_to_blocks(self, CacheIndex src_index not None, dst_cache, dst_blocks,
                            KvCacheExtParam ext_param=None):
        """Pulls batch row ``src_index.batch_index`` of the peer's contiguous cache into local blocks:
        chunk j (one local block) lands in ``dst_blocks[j]``. Raises as :meth:`pull_kv_blocks`."""
        cdef vector[uint64_t] dst
        _as_blocks(dst_blocks, dst, "dst_blocks")
        cdef CCache c
        c.cache_id = _cache_id(dst_cache)
        cdef const CKvCacheExtParam* ext = &_DEFAULT_EXT._c if ext_param is None else &ext_param._c
        cdef Status st
        with nogil:
            st = ImplAccess.PullRowToBlocks(self._impl.get()[0], src_index._c, c, dst, ext[0])
        check_status(st, b"pull_blocks")

    def metrics(self):
        """This engine's counters now: a plain dict (README "Metrics"; fields in ``_lib.pyi``).

        Read without blocking transfers; counters only grow for the engine's life."""
        cdef c_string s
        with nogil:
            s = ImplAccess.MetricsJson(self._impl.get()[0])
        return _json.loads(s.decode())

    def _has_links(self):
        return ImplAccess.HasLinks(self._impl.get()[0])

    def _link_channels(self, uint64_t cluster_id):
        return ImplAccess.LinkChannels(self._impl.get()[0], cluster_id)

    def _describe_remote_cache(self, uint64_t cluster_id, int64_t cache_id):
        """The peer's cache as announced at link time (or, for one registered later, as it answered
        when asked): a dict of num_tensors, tensor_bytes,
        num_blocks, batch_size, stride, key and addrs. Raises LinkError / CacheNotExistError."""
        cdef CRemoteCacheInfo info
        cdef Status st
        with nogil:  # may ask the peer (a cache registered after linking)
            st = ImplAccess.DescribeRemoteCache(self._impl.get()[0], cluster_id, cache_id, info)
        check_status(st, b"describe_remote_cache")
        return {"cache_id": info.cache_id, "key": info.key, "allocated": info.allocated,
                "batch_keys": list(info.batch_keys), "num_tensors": info.num_tensors,
                "tensor_bytes": info.tensor_bytes, "num_blocks": info.num_blocks, "batch_size": info.batch_size,
                "stride": info.stride, "addrs": list(info.addrs)}

    def _find_remote_cache(self, uint64_t cluster_id, int64_t key):
        cdef int64_t cid = -1
        cdef Status st
        with nogil:  # may ask the peer (a key bound after linking)
            st = ImplAccess.FindRemoteCache(self._impl.get()[0], cluster_id, key, cid)
        check_status(st, b"find_remote_cache")
        return cid

    def send_notify(self, uint64_t cluster_id, name, message, int32_t timeout_in_millis=1000):
        """Sends a notification to linked cluster ``cluster_id`` and waits until it is queued there.

        It arrives after every transfer on that link that returned (or whose handle completed)
        before this call, so "your blocks are there" can be a notification. ``name`` and
        ``message`` are ``str`` (UTF-8) or ``bytes`` of at most 1024 bytes each. The receiver
        queues at most 4096 undelivered notifications from all peers together.

        Raises
        ------
        TypeError
            ``name`` or ``message`` is not str or bytes.
        ParamInvalidError
            ``name`` or ``message`` is longer than 1024 bytes, or ``timeout_in_millis`` <= 0.
        LinkError
            Not linked to ``cluster_id`` (``LLM_NOT_YET_LINK``), the link broke, or the peer's queue
            is full (``LLM_LINK_BUSY``: nothing was queued; retry after it called get_notifies).
        LLMTimeoutError
            The peer did not acknowledge it within ``timeout_in_millis``.
        """
        cdef c_string n = _notify_bytes(name, "name")
        cdef c_string m = _notify_bytes(message, "message")
        cdef Status st
        with nogil:
            st = ImplAccess.SendNotify(self._impl.get()[0], cluster_id, n, m, timeout_in_millis)
        check_status(st, b"send_notify")

    def get_notifies(self):
        """Takes every notification received so far, oldest first, as a list of
        ``(from_cluster_id, name, message)`` tuples (``name`` and ``message`` decoded as UTF-8,
        invalid bytes replaced).

        Raises
        ------
        LLMException
            The engine is not initialized (``LLM_FAILED``).
        """
        cdef vector[CNotifyMessage] got
        cdef Status st
        with nogil:
            st = ImplAccess.GetNotifies(self._impl.get()[0], got)
        check_status(st, b"get_notifies")
        return [(x.from_cluster_id, x.name.decode("utf-8", "replace"), x.message.decode("utf-8", "replace"))
                for x in got]


cdef int _fill_src_cache(object cache, CCache& c) except -1:
    """The runtime reads placement and num_tensors of a push source from the caller (as CANN)."""
    c.cache_id = _cache_id(cache)
    if isinstance(cache, Cache):
        d = (<Cache>cache).cache_desc
        c.cache_desc.num_tensors = (<CacheDesc>d).num_tensors
        c.cache_desc.placement = <CCachePlacement>(<int>(<CacheDesc>d)._placement)  # checked when set
    return 0


cdef c_string _notify_bytes(object v, str what) except *:
    if isinstance(v, str):
        return (<str>v).encode("utf-8")
    if isinstance(v, bytes):
        return <bytes>v
    raise TypeError(f"{what} must be str or bytes, got {type(v).__name__}")


import collections as _collections

LinkFailure = _collections.namedtuple("LinkFailure", ["reason", "status", "message"])
LinkFailure.__doc__ = ("Why a link failed (LlmDataDist.link_failure): ``reason`` (one of LINK_FAILURE_REASONS), "
                       "``status`` (what link_llm_clusters returned for it) and ``message``.")
LINK_FAILURE_REASONS = ("refused", "unreachable", "timed_out", "auth_refused", "wrong_cluster_id",
                        "version_mismatch", "limit_exceeded", "already_linked", "other")


cdef _status(Status s):
    try:
        return _Status(s)
    except ValueError:
        return s


# ---------------------------------------------------------------- nogil entry points
cdef Status pull_blocks_nogil(CLlmDataDist* dd, uint64_t src_cluster_id, int64_t src_cache_id,
                              int64_t dst_cache_id, const uint64_t* src_blocks, const uint64_t* dst_blocks,
                              size_t n, int32_t src_first, int32_t src_last, int32_t dst_first,
                              int32_t dst_last, uint8_t tensor_num_per_layer) noexcept nogil:
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
    return PullBlocksRaw(dd[0], idx, c, src_blocks, dst_blocks, n, ext)


cdef Status push_blocks_nogil(CLlmDataDist* dd, int64_t src_cache_id, uint32_t src_num_tensors,
                              uint64_t dst_cluster_id, int64_t dst_cache_id, const uint64_t* src_blocks,
                              const uint64_t* dst_blocks, size_t n, int32_t src_first, int32_t src_last,
                              int32_t dst_first, int32_t dst_last, uint8_t tensor_num_per_layer) noexcept nogil:
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
    return PushBlocksRaw(dd[0], c, idx, src_blocks, dst_blocks, n, ext)


include "_async.pxi"
include "_hixl.pxi"
include "_layerwise.pxi"
include "_layout.pxi"


def process_metrics():
    """Every engine of this process (LlmDataDist and hixl engines alike): a list of the dicts
    :meth:`LlmDataDist.metrics` returns. Takes no engine lock a transfer needs."""
    cdef c_string s
    with nogil:
        s = ProcessMetricsJson()
    return _json.loads(s.decode())
