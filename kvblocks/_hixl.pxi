# SPDX-License-Identifier: Apache-2.0
# CANN's hixl engine (include/hixl/hixl.h) for Python; kvblocks.hixl re-exports it with the
# package layout of CANN's `hixl`. No method raises for a failed operation: failures are status
# codes. Only argument conversion raises (TypeError, OverflowError). Every engine call releases the GIL.
from kvblocks.includes.libhixl cimport *

# Set by kvblocks.hixl on import (its IntEnums), so `import kvblocks` creates no enum classes.
_hixl_enums = {}


cdef inline object _hx_transfer_status(int v):
    return _hixl_enums["TransferStatus"](v)


cdef inline object _hx_connect_status(int v):
    return _hixl_enums["AsyncConnectStatus"](v)


cdef CAscendString _hx_str(object s, str what) except *:
    if not isinstance(s, str):
        raise TypeError(f"{what} must be str, got {type(s).__name__}")
    cdef bytes b = (<str>s).encode("utf-8")
    return CAscendString(b, len(b))


cdef str _hx_py(const CAscendString& s):
    return s.GetString()[:s.GetLength()].decode("utf-8", "replace")


cdef class MemDesc:
    """A memory range ``[addr, addr + len)`` to register (hixl ``MemDesc``)."""
    cdef HMemDesc _c

    def __init__(self, uintptr_t addr, size_t len):
        self._c.addr = addr
        self._c.len = len

    @property
    def addr(self):
        return self._c.addr

    @addr.setter
    def addr(self, uintptr_t v):
        self._c.addr = v

    @property
    def len(self):
        return self._c.len

    @len.setter
    def len(self, size_t v):
        self._c.len = v

    def __repr__(self):
        return f"MemDesc(addr={self._c.addr:#x}, len={self._c.len})"


cdef class TransferOpDesc:
    """One copy of ``len`` bytes between ``local_addr`` and the remote engine's ``remote_addr``."""
    cdef HTransferOpDesc _c

    def __init__(self, uintptr_t local_addr, uintptr_t remote_addr, size_t len):
        self._c.local_addr = local_addr
        self._c.remote_addr = remote_addr
        self._c.len = len

    @property
    def local_addr(self):
        return self._c.local_addr

    @local_addr.setter
    def local_addr(self, uintptr_t v):
        self._c.local_addr = v

    @property
    def remote_addr(self):
        return self._c.remote_addr

    @remote_addr.setter
    def remote_addr(self, uintptr_t v):
        self._c.remote_addr = v

    @property
    def len(self):
        return self._c.len

    @len.setter
    def len(self, size_t v):
        self._c.len = v

    def __repr__(self):
        return (f"TransferOpDesc(local_addr={self._c.local_addr:#x}, remote_addr={self._c.remote_addr:#x}, "
                f"len={self._c.len})")


cdef class TransferArgs:
    """Optional arguments of ``transfer_async``: ``user_data``, an opaque pointer-sized int handed
    back in ``TransferResult.user_data``."""
    cdef public uintptr_t user_data

    def __init__(self):
        self.user_data = 0


cdef class GetTransferStatusArgs:
    """Arguments of ``get_all_transfer_status``."""
    cdef public uint32_t max_query_count
    cdef public c_bool skip_waiting

    def __init__(self, uint32_t max_query_count=4294967295, c_bool skip_waiting=False):
        self.max_query_count = max_query_count
        self.skip_waiting = skip_waiting


cdef class TransferResult:
    """The outcome of one asynchronous request; ``status`` is read-only."""
    cdef public uintptr_t req
    cdef public uintptr_t user_data
    cdef object _status

    def __init__(self):
        self.req = 0
        self.user_data = 0
        self._status = _hx_transfer_status(0)

    @property
    def status(self):
        return self._status

    def __repr__(self):
        return f"TransferResult(req={self.req}, user_data={self.user_data}, status={self._status!r})"


cdef class NotifyDesc:
    """A notification: ``name`` and ``notify_msg``, each at most 1024 UTF-8 bytes."""
    cdef public str name
    cdef public str notify_msg

    def __init__(self, str name, str notify_msg):
        self.name = name
        self.notify_msg = notify_msg

    def __repr__(self):
        return f"NotifyDesc(name={self.name!r}, notify_msg={self.notify_msg!r})"


cdef c_map[CAscendString, CAscendString] _hx_options(object options) except *:
    cdef c_map[CAscendString, CAscendString] out
    if options is None:
        return out
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict[str, str], got {type(options).__name__}")
    for k, v in options.items():
        out[_hx_str(k, "an option key")] = _hx_str(v, "an option value")
    return out


cdef int _hx_descs(object op_descs, vector[HTransferOpDesc]& out) except -1:
    cdef Py_ssize_t i, n
    if type(op_descs) is list:
        n = len(<list>op_descs)
        out.resize(n)
        for i in range(n):
            out[i] = (<TransferOpDesc?>(<list>op_descs)[i])._c
        return 0
    if not isinstance(op_descs, (list, tuple)):
        raise TypeError(f"op_descs must be a list of TransferOpDesc, got {type(op_descs).__name__}")
    for d in op_descs:
        out.push_back((<TransferOpDesc?>d)._c)
    return 0


def get_capability(feature_type):
    """``(status, value)``: ``FEATURE_SUPPORTED`` (1) for AUTO_CONNECT and CLIENT_SERVER_COMM, 0 for
    any other non-negative value, ``(PARAM_INVALID, 0)`` for a negative one. Needs no engine.

    Raises
    ------
    TypeError
        ``feature_type`` is not an int.
    """
    cdef int64_t f = feature_type
    cdef int32_t value = 0
    if f < 0 or f > 0x7FFFFFFF:
        return (H_PARAM_INVALID if f < 0 else 0), 0
    cdef HStatus st = CHixl.GetCapability(<HFeatureType>f, value)
    return st, value


cdef class Hixl:
    """CANN's hixl engine on kvblocks (see the module documentation). Methods return status codes."""
    cdef CHixl* _h
    cdef object _last_name  # the last remote name converted, and its conversion (transfers repeat it)
    cdef CAscendString _last_c

    def __cinit__(self):
        self._h = new CHixl()

    def __dealloc__(self):
        if self._h != NULL:
            with nogil:
                del self._h  # finalizes
            self._h = NULL

    cdef CAscendString _remote(self, object remote_engine) except *:
        if remote_engine is not self._last_name:
            self._last_c = _hx_str(remote_engine, "remote_engine")
            self._last_name = remote_engine
        return self._last_c

    def initialize(self, local_engine, options=None):
        """Initializes the engine named (and listening at) ``local_engine``; returns a status.

        Raises
        ------
        TypeError
            ``local_engine`` is not a str or ``options`` is not a dict[str, str].
        """
        cdef CAscendString name = _hx_str(local_engine, "local_engine")
        cdef c_map[CAscendString, CAscendString] o = _hx_options(options)
        cdef HStatus st
        with nogil:
            st = self._h.Initialize(name, o)
        return st

    def finalize(self):
        """Closes links, forgets requests and registrations, stops listening. Idempotent."""
        with nogil:
            self._h.Finalize()

    def register_mem(self, MemDesc mem_desc not None, mem_type, /):
        """``(status, mem_handle)``.

        Raises
        ------
        TypeError
            ``mem_desc`` is not a MemDesc or ``mem_type`` not MEM_DEVICE/MEM_HOST (0/1).
        """
        cdef int t = mem_type
        cdef HMemHandle h = NULL
        cdef HStatus st
        if t != 0 and t != 1:  # as upstream, only a MemType converts (a C++ enum cannot hold others)
            raise TypeError(f"mem_type must be MEM_DEVICE or MEM_HOST, got {mem_type!r}")
        with nogil:
            st = self._h.RegisterMem(mem_desc._c, <HMemType>t, h)
        return st, <uintptr_t>h

    def deregister_mem(self, uintptr_t mem_handle, /):
        """Deregisters; returns a status."""
        cdef HStatus st
        with nogil:
            st = self._h.DeregisterMem(<HMemHandle>mem_handle)
        return st

    def connect(self, remote_engine, int32_t timeout_in_millis=1000):
        """Links to ``remote_engine``; returns a status.

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str.
        """
        cdef CAscendString r = _hx_str(remote_engine, "remote_engine")
        cdef HStatus st
        with nogil:
            st = self._h.Connect(r, timeout_in_millis)
        return st

    def disconnect(self, remote_engine, int32_t timeout_in_millis=1000):
        """Unlinks ``remote_engine``, forgetting its pending requests; returns a status.

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str.
        """
        cdef CAscendString r = _hx_str(remote_engine, "remote_engine")
        cdef HStatus st
        with nogil:
            st = self._h.Disconnect(r, timeout_in_millis)
        return st

    def connect_async(self, remote_engine, int32_t timeout_in_millis=1000):
        """Queues a connect; returns a status (the outcome shows in get_async_connect_status).

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str.
        """
        cdef CAscendString r = _hx_str(remote_engine, "remote_engine")
        cdef HStatus st
        with nogil:
            st = self._h.ConnectAsync(r, timeout_in_millis)
        return st

    def disconnect_async(self, remote_engine, int32_t timeout_in_millis=1000):
        """Queues a disconnect; returns a status.

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str.
        """
        cdef CAscendString r = _hx_str(remote_engine, "remote_engine")
        cdef HStatus st
        with nogil:
            st = self._h.DisconnectAsync(r, timeout_in_millis)
        return st

    def get_async_connect_status(self, remote_engine, /):
        """``(status, AsyncConnectStatus)`` of the async connect/disconnect tasks for a remote.

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str.
        """
        cdef CAscendString r = _hx_str(remote_engine, "remote_engine")
        cdef HAsyncConnectStatus s
        cdef HStatus st
        with nogil:
            st = self._h.GetAsyncConnectStatus(r, s)
        return st, _hx_connect_status(<int>s)

    def get_all_async_connect_status(self):
        """``(status, {remote: AsyncConnectStatus})`` for every remote with an async task state."""
        cdef c_map[CAscendString, HAsyncConnectStatus] m
        cdef HStatus st
        with nogil:
            st = self._h.GetAsyncConnectStatus(m)
        return st, {_hx_py(kv.first): _hx_connect_status(<int>kv.second) for kv in m}

    def transfer_sync(self, remote_engine, op, op_descs, int32_t timeout_in_millis=1000):
        """READ (remote -> local) or WRITE (local -> remote) every desc; returns a status once all
        bytes are in place, or TIMEOUT (then no byte changes later).

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str, ``op`` not READ/WRITE (0/1), or ``op_descs`` not a list of
            TransferOpDesc.
        """
        cdef CAscendString r = self._remote(remote_engine)
        cdef int o = op
        cdef vector[HTransferOpDesc] descs
        _hx_descs(op_descs, descs)
        cdef HStatus st
        if o != 0 and o != 1:  # as upstream, only a TransferOp converts
            raise TypeError(f"op must be READ or WRITE, got {op!r}")
        with nogil:
            st = self._h.TransferSync(r, <HTransferOp>o, descs, timeout_in_millis)
        return st

    def transfer_async(self, remote_engine, op, op_descs, TransferArgs args=None):
        """Submits the transfer; ``(status, req)`` with ``req != 0`` on success.

        Raises
        ------
        TypeError
            As transfer_sync, or ``args`` is not a TransferArgs.
        """
        cdef CAscendString r = self._remote(remote_engine)
        cdef int o = op
        cdef vector[HTransferOpDesc] descs
        _hx_descs(op_descs, descs)
        cdef HTransferArgs a
        if args is not None:
            a.user_data = <const void*>args.user_data
        cdef HTransferReq req = NULL
        cdef HStatus st
        if o != 0 and o != 1:
            raise TypeError(f"op must be READ or WRITE, got {op!r}")
        with nogil:
            st = self._h.TransferAsync(r, <HTransferOp>o, descs, a, req)
        return st, <uintptr_t>req

    def get_transfer_status(self, uintptr_t req, /):
        """``(status, TransferStatus)``; a finished request is reported once, then retired."""
        cdef HTransferStatus s
        cdef HStatus st
        with nogil:
            st = self._h.GetTransferStatus(<HTransferReq>req, s)
        return st, _hx_transfer_status(<int>s)

    def get_all_transfer_status(self, GetTransferStatusArgs args=None):
        """``(status, [TransferResult])`` of the outstanding requests, oldest first; finished ones
        are retired."""
        cdef HGetTransferStatusArgs a
        if args is not None:
            a.max_query_count = args.max_query_count
            a.skip_waiting = args.skip_waiting
        cdef vector[HTransferResult] res
        cdef HStatus st
        with nogil:
            st = self._h.GetTransferStatus(a, res)
        out = []
        cdef TransferResult tr
        for x in res:
            tr = TransferResult.__new__(TransferResult)
            tr.req = <uintptr_t>x.req
            tr.user_data = <uintptr_t>x.user_data
            tr._status = _hx_transfer_status(<int>x.status)
            out.append(tr)
        return st, out

    def send_notify(self, remote_engine, NotifyDesc notify not None, int32_t timeout_in_millis=1000):
        """Sends a notification over the link to ``remote_engine`` and waits until it is queued
        there; it follows every transfer to that remote submitted before it. Returns a status.

        Raises
        ------
        TypeError
            ``remote_engine`` is not a str or ``notify`` not a NotifyDesc.
        """
        cdef CAscendString r = _hx_str(remote_engine, "remote_engine")
        cdef HNotifyDesc n
        n.name = _hx_str(notify.name, "notify.name")
        n.notify_msg = _hx_str(notify.notify_msg, "notify.notify_msg")
        cdef HStatus st
        with nogil:
            st = self._h.SendNotify(r, n, timeout_in_millis)
        return st

    def get_notifies(self):
        """``(status, [NotifyDesc])``: every notification received, in arrival order; the queue is
        then empty."""
        cdef vector[HNotifyDesc] got
        cdef HStatus st
        with nogil:
            st = self._h.GetNotifies(got)
        return st, [NotifyDesc(_hx_py(x.name), _hx_py(x.notify_msg)) for x in got]
