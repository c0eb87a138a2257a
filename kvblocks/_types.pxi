# SPDX-License-Identifier: Apache-2.0
# Value types of the Python API: enums, CacheDesc, CacheIndex, KvCacheExtParam, IpInfo,
# ClusterInfo and Cache (with zero-copy tensor views).
import enum as _enum
import operator as _operator


class LlmRole(_enum.IntEnum):
    """Role of a participant (CANN ``LlmRole``)."""
    PROMPT = 1
    DECODER = 2
    MIX = 3


class CachePlacement(_enum.IntEnum):
    """Where a cache lives; ``DEVICE`` is served by host memory on machines without an accelerator."""
    HOST = 0
    DEVICE = 1


class DataType(_enum.IntEnum):
    """Element types with ge's numbering."""
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_STRING = 13
    DT_DUAL_SUB_INT8 = 14
    DT_DUAL_SUB_UINT8 = 15
    DT_COMPLEX64 = 16
    DT_COMPLEX128 = 17
    DT_QINT8 = 18
    DT_QINT16 = 19
    DT_QINT32 = 20
    DT_QUINT8 = 21
    DT_QUINT16 = 22
    DT_RESOURCE = 23
    DT_STRING_REF = 24
    DT_DUAL = 25
    DT_VARIANT = 26
    DT_BF16 = 27
    DT_UNDEFINED = 28
    DT_INT4 = 29
    DT_UINT1 = 30
    DT_INT2 = 31
    DT_UINT2 = 32
    DT_COMPLEX32 = 33
    DT_HIFLOAT8 = 34
    DT_FLOAT8_E5M2 = 35
    DT_FLOAT8_E4M3FN = 36
    DT_FLOAT8_E8M0 = 37
    DT_FLOAT6_E3M2 = 38
    DT_FLOAT6_E2M3 = 39
    DT_FLOAT4_E2M1 = 40
    DT_FLOAT4_E1M2 = 41


# Values the C++ enums declare beyond the Python ones (LlmRole::kEnd; ge::DT_HIFLOAT4 and the DT_MAX
# sentinel): they pass the Python boundary like any declared value, and the runtime decides, as in
# CANN's C++ API (kEnd and DT_MAX: LLM_PARAM_INVALID).
_ROLE_KEND = 4
_DT_CPP_ONLY = (42, 43)


def _valid_values(cls):
    """``cls``'s values for a message: each named when few, else as ranges ("0-4, 6-42")."""
    members = sorted(cls, key=int)
    if len(members) <= 4:
        return ", ".join(f"{m.name} ({int(m)})" for m in members)
    vals = [int(m) for m in members]
    runs = []
    start = prev = vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return f"{', '.join(runs)} ({cls.__name__} members)"


def _article(word):
    return ("an " if word[0] in "AEILMNORSX" else "a ") + word  # "an LlmRole", "a DataType"


def _enum_arg(name, value, cls, extra=()):
    """``value`` (a ``cls`` member or an integer equal to one, or one of ``extra``) as a ``cls``
    member (an int for ``extra``). Every int that becomes a C++ enum passes here first: a value the
    C++ enum does not declare would be undefined behaviour there.

    TypeError for a non-integer (bool included), ValueError naming ``name`` and the valid values."""
    if isinstance(value, cls):
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be {_article(cls.__name__)}, got bool")
    try:
        v = _operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {_article(cls.__name__)}, got {type(value).__name__}") from None
    if v in extra:
        return v
    try:
        return cls(v)
    except ValueError:
        raise ValueError(f"{name}={v} is not a valid {cls.__name__}; valid values: {_valid_values(cls)}") from None


# numpy dtype names for DataType members numpy can represent; others are viewed as raw bytes.
_NUMPY_DTYPES = {0: "float32", 1: "float16", 2: "int8", 3: "int32", 4: "uint8", 6: "int16", 7: "uint16",
                 8: "uint32", 9: "int64", 10: "uint64", 11: "float64", 12: "bool", 16: "complex64",
                 17: "complex128", 18: "int8", 19: "int16", 20: "int32", 21: "uint8", 22: "uint16",
                 27: "uint16"}
_DTYPE_FROM_NUMPY = {"float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6,
                     "uint16": 7, "uint32": 8, "int64": 9, "uint64": 10, "float64": 11, "bool": 12,
                     "complex64": 16, "complex128": 17, "bfloat16": 27}
_DTYPE_FROM_FORMAT = {"f": 0, "e": 1, "b": 2, "i": 3, "B": 4, "h": 6, "H": 7, "I": 8, "q": 9, "Q": 10,
                      "d": 11, "?": 12, "Zf": 16, "Zd": 17, "c": 4}


cdef class CacheDesc:
    """Describes a cache: ``num_tensors`` tensors of ``shape`` and ``data_type``; ``shape[0]`` is
    the block (batch) dimension.

    Raises
    ------
    TypeError
        ``shape`` is not a sequence of ints.
    """
    cdef public uint32_t num_tensors
    cdef object _data_type
    cdef public tuple shape
    cdef object _placement

    def __init__(self, num_tensors=0, data_type=DataType.DT_UNDEFINED, shape=(),
                 placement=CachePlacement.DEVICE):
        if not isinstance(shape, (list, tuple)) or not all(type(d) is int for d in shape):
            raise TypeError("shape must be a list or tuple of int")
        self.num_tensors = num_tensors
        self.data_type = data_type
        self.shape = tuple(shape)
        self.placement = placement

    @property
    def data_type(self):
        """A :class:`DataType`; setting a value it does not have raises ValueError."""
        return self._data_type

    @data_type.setter
    def data_type(self, v):
        self._data_type = _enum_arg("data_type", v, DataType, _DT_CPP_ONLY)

    @property
    def placement(self):
        """A :class:`CachePlacement`; setting a value it does not have raises ValueError."""
        return self._placement

    @placement.setter
    def placement(self, v):
        self._placement = _enum_arg("placement", v, CachePlacement)

    cdef int _to_c(self, CCacheDesc& out) except -1:
        # data_type and placement were checked when set (_enum_arg): the casts below are defined.
        out.num_tensors = self.num_tensors
        out.data_type = <CDataType>(<int>self._data_type)
        out.placement = <CCachePlacement>(<int>self._placement)
        out.shape.clear()
        for d in self.shape:
            out.shape.push_back(d)
        return 0

    @property
    def tensor_bytes(self):
        """Bytes of one tensor, or -1 when the shape or type has no size."""
        cdef vector[int64_t] s = self.shape
        return TensorBytes(<int>self._data_type, s.data(), s.size())

    @property
    def num_blocks(self):
        """``shape[0]``."""
        return self.shape[0] if self.shape else 0

    @property
    def block_bytes(self):
        """Bytes of one block of one tensor: ``prod(shape[1:])`` x element size."""
        tb = self.tensor_bytes
        return tb // self.shape[0] if tb > 0 else -1

    def __repr__(self):
        dt = self.data_type.name if isinstance(self.data_type, DataType) else self.data_type
        return f"CacheDesc(num_tensors={self.num_tensors}, data_type={dt}, shape={list(self.shape)}, placement={self.placement!r})"

    def __eq__(self, other):
        if not isinstance(other, CacheDesc):
            return NotImplemented
        o = <CacheDesc>other
        return (self.num_tensors == o.num_tensors and self.data_type == o.data_type and
                self.shape == o.shape and self.placement == o.placement)


cdef class CacheIndex:
    """Names a peer's cache: its ``cluster_id``, its ``cache_id`` and a ``batch_index``
    (``pull_kv_cache``/``push_kv_cache`` only)."""
    cdef CCacheIndex _c

    def __init__(self, uint64_t cluster_id, int64_t cache_id, uint32_t batch_index=0):
        self._c.cluster_id = cluster_id
        self._c.cache_id = cache_id
        self._c.batch_index = batch_index

    @property
    def cluster_id(self):
        return self._c.cluster_id

    @cluster_id.setter
    def cluster_id(self, uint64_t v):
        self._c.cluster_id = v

    @property
    def cache_id(self):
        return self._c.cache_id

    @cache_id.setter
    def cache_id(self, int64_t v):
        self._c.cache_id = v

    @property
    def batch_index(self):
        return self._c.batch_index

    @batch_index.setter
    def batch_index(self, uint32_t v):
        self._c.batch_index = v

    def __repr__(self):
        return f"CacheIndex(cluster_id={self._c.cluster_id}, cache_id={self._c.cache_id}, batch_index={self._c.batch_index})"


cdef class KvCacheExtParam:
    """Layer selection of a transfer. Ranges are inclusive ``(first, last)`` pairs;
    ``(-1, -1)`` selects every layer. Layer ``l`` is tensors
    ``[l * tensor_num_per_layer, (l + 1) * tensor_num_per_layer)``."""
    cdef CKvCacheExtParam _c

    def __init__(self, src_layer_range=(-1, -1), dst_layer_range=(-1, -1), tensor_num_per_layer=2):
        self.src_layer_range = src_layer_range
        self.dst_layer_range = dst_layer_range
        self.tensor_num_per_layer = tensor_num_per_layer

    @property
    def src_layer_range(self):
        return (self._c.src_layer_range.first, self._c.src_layer_range.second)

    @src_layer_range.setter
    def src_layer_range(self, v):
        a, b = _range_pair(v, "src_layer_range")
        self._c.src_layer_range = c_pair[int32_t, int32_t](a, b)

    @property
    def dst_layer_range(self):
        return (self._c.dst_layer_range.first, self._c.dst_layer_range.second)

    @dst_layer_range.setter
    def dst_layer_range(self, v):
        a, b = _range_pair(v, "dst_layer_range")
        self._c.dst_layer_range = c_pair[int32_t, int32_t](a, b)

    @property
    def tensor_num_per_layer(self):
        return self._c.tensor_num_per_layer

    @tensor_num_per_layer.setter
    def tensor_num_per_layer(self, v):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError("tensor_num_per_layer must be an int")
        if not 0 <= v <= 255:
            raise ValueError("tensor_num_per_layer must be in [0, 255] (uint8)")
        self._c.tensor_num_per_layer = v

    def __repr__(self):
        return (f"KvCacheExtParam(src_layer_range={self.src_layer_range}, "
                f"dst_layer_range={self.dst_layer_range}, tensor_num_per_layer={self.tensor_num_per_layer})")


def _range_pair(v, name):
    if not isinstance(v, (tuple, list)) or len(v) != 2 or not all(type(x) is int for x in v):
        raise TypeError(f"{name} must be a pair of ints (first, last)")
    if not all(-2**31 <= x < 2**31 for x in v):
        raise ValueError(f"{name} values must fit int32")
    return v[0], v[1]


cdef KvCacheExtParam _DEFAULT_EXT = KvCacheExtParam()


cdef class IpInfo:
    """An address: ``ip`` (dotted IPv4) and ``port``."""
    cdef public str ip
    cdef public uint16_t port

    def __init__(self, str ip="", uint16_t port=0):
        self.ip = ip
        self.port = port

    def __repr__(self):
        return f"IpInfo({self.ip!r}, {self.port})"


cdef class ClusterInfo:
    """A peer to link to: its cluster id and exactly one local and one remote :class:`IpInfo`."""
    cdef public uint64_t remote_cluster_id
    cdef public int32_t remote_role_type
    cdef public list local_ip_infos
    cdef public list remote_ip_infos

    def __init__(self, uint64_t remote_cluster_id=0, int32_t remote_role_type=0, local_ip_infos=None,
                 remote_ip_infos=None):
        self.remote_cluster_id = remote_cluster_id
        self.remote_role_type = remote_role_type
        self.local_ip_infos = list(local_ip_infos or [])
        self.remote_ip_infos = list(remote_ip_infos or [])

    def __repr__(self):
        return (f"ClusterInfo({self.remote_cluster_id}, local_ip_infos={self.local_ip_infos}, "
                f"remote_ip_infos={self.remote_ip_infos})")


cdef class _Pin:
    """Keeps runtime-owned cache memory mapped while views of it exist."""
    cdef shared_ptr[void] p


cdef class _TensorView:
    """Buffer exporter over one tensor; holds its Cache (and so the memory) alive."""
    cdef object owner
    cdef char* ptr
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer* buf, int flags):
        buf.buf = self.ptr
        buf.obj = self
        buf.len = self.shape[0]
        buf.readonly = 0
        buf.itemsize = 1
        buf.format = NULL
        if flags & PyBUF_FORMAT:
            buf.format = "B"
        buf.ndim = 1
        buf.shape = self.shape
        buf.strides = self.strides
        buf.suboffsets = NULL
        buf.internal = NULL

    def __releasebuffer__(self, Py_buffer* buf):
        pass


cdef class Cache:
    """A registered or allocated cache. Returned by :class:`LlmDataDist`; not constructed directly.

    Attributes
    ----------
    cache_id : int
    cache_desc : CacheDesc
    tensor_addrs : list[int]
    """
    cdef readonly int64_t cache_id
    cdef readonly CacheDesc cache_desc
    cdef readonly list tensor_addrs
    cdef readonly bint is_blocks_cache
    cdef uint64_t _num_blocks
    cdef int64_t _tensor_bytes
    cdef object _pin
    cdef object _keepalive

    def __init__(self):
        raise TypeError("Do not call Cache's constructor directly; use LlmDataDist.allocate_cache, "
                        "register_kv_cache or register_arrays")

    @staticmethod
    cdef Cache _create(int64_t cache_id, CacheDesc desc, list addrs, object pin, object keepalive,
                       bint blocks):
        cdef Cache c = Cache.__new__(Cache)
        c.cache_id = cache_id
        c.cache_desc = desc
        c.tensor_addrs = addrs
        c.is_blocks_cache = blocks
        c._num_blocks = desc.shape[0] if desc.shape else 0
        c._tensor_bytes = desc.tensor_bytes
        c._pin = pin
        c._keepalive = keepalive
        return c

    def tensor(self, Py_ssize_t i):
        """A writable ``memoryview`` (bytes) over tensor ``i``.

        Raises
        ------
        IndexError
            ``i`` is out of range.
        """
        if not 0 <= i < len(self.tensor_addrs):
            raise IndexError(f"tensor index {i} out of range for {len(self.tensor_addrs)} tensors")
        cdef _TensorView v = _TensorView.__new__(_TensorView)
        v.owner = self
        v.ptr = <char*><uintptr_t>self.tensor_addrs[i]
        v.shape[0] = self._tensor_bytes
        v.strides[0] = 1
        return memoryview(v)

    def numpy(self, Py_ssize_t i):
        """Tensor ``i`` as a numpy array with the cache's shape and dtype (imports numpy now).

        Types numpy cannot represent are returned as ``uint8`` of shape ``(shape[0], block_bytes)``.

        Raises
        ------
        ImportError
            numpy is not installed.
        IndexError
            ``i`` is out of range.
        """
        try:
            import numpy as np
        except ImportError as e:
            raise ImportError("Cache.numpy() needs numpy: pip install numpy") from e
        buf = self.tensor(i)
        name = _NUMPY_DTYPES.get(int(self.cache_desc.data_type))
        if name is None:
            return np.frombuffer(buf, dtype=np.uint8).reshape(self.cache_desc.shape[0], -1)
        return np.frombuffer(buf, dtype=name).reshape(self.cache_desc.shape)

    @property
    def num_blocks(self):
        return self._num_blocks

    def __repr__(self):
        return f"Cache(cache_id={self.cache_id}, {self.cache_desc!r})"


# DLPack device types (dlpack.h DLDeviceType) that this process's CPU addresses: kDLCPU, kDLCUDAHost
# (pinned host memory), kDLCUDAManaged is not among them (it may live on the device).
_DLPACK_HOST = (1, 3)
_DLPACK_NAMES = {2: "CUDA", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 13: "CUDA managed",
                 14: "oneAPI"}


def _refuse_device_memory(k, a):
    """Raises TypeError for memory no backend serves here: every cache is host memory (the runtime's
    MemKind); a CUDA array is refused by name until a backend serves CUDA memory."""
    if hasattr(type(a), "__cuda_array_interface__") or hasattr(a, "__cuda_array_interface__"):
        raise TypeError(f"arrays[{k}] ({type(a).__name__}) is CUDA memory: no backend serves CUDA memory here "
                        "(register host memory)")
    dev = getattr(a, "__dlpack_device__", None)
    if dev is None:
        return
    try:
        kind = int(dev()[0])
    except Exception:  # a broken __dlpack_device__: the buffer checks below decide
        return
    if kind not in _DLPACK_HOST:
        what = _DLPACK_NAMES.get(kind, f"DLPack device type {kind}")
        raise TypeError(f"arrays[{k}] ({type(a).__name__}) is {what} memory: no backend serves {what} memory here "
                        "(register host memory)")


def _describe_arrays(arrays, placement):
    """Derives (CacheDesc, addresses, keepalive) from same-shape writable C-contiguous buffers."""
    if not isinstance(arrays, (list, tuple)) or len(arrays) == 0:
        raise TypeError("arrays must be a non-empty list of buffers")
    addrs = []
    keep = []
    shape = None
    dtype = None
    for k, a in enumerate(arrays):
        _refuse_device_memory(k, a)
        mod = type(a).__module__
        if mod.startswith("torch"):
            if a.device.type != "cpu":
                raise TypeError(f"arrays[{k}]: only CPU torch tensors can be registered")
            if not a.is_contiguous():
                raise TypeError(f"arrays[{k}] is not contiguous")
            name = str(a.dtype).replace("torch.", "")
            dt = _DTYPE_FROM_NUMPY.get(name)
            if dt is None:
                raise TypeError(f"arrays[{k}]: unsupported dtype {a.dtype}")
            shp = tuple(a.shape)
            addr = a.data_ptr()
        else:
            try:
                m = memoryview(a)
            except (TypeError, ValueError):  # ValueError: numpy types with no buffer format (datetime64)
                raise TypeError(f"arrays[{k}] ({type(a).__name__}) does not export a plain buffer") from None
            if m.readonly:
                raise TypeError(f"arrays[{k}] is read-only")
            if not m.c_contiguous:
                raise TypeError(f"arrays[{k}] is not C-contiguous")
            fmt = m.format.lstrip("@=<")
            dt = None
            if hasattr(a, "dtype"):
                dt = _DTYPE_FROM_NUMPY.get(str(a.dtype))
            if dt is None:
                dt = _DTYPE_FROM_FORMAT.get(fmt)
            if dt is None:
                raise TypeError(f"arrays[{k}]: unsupported element format {m.format!r}")
            shp = tuple(m.shape) if m.ndim > 0 else (1,)
            if m.nbytes == 0:
                raise TypeError(f"arrays[{k}] is empty")
            addr = _buffer_address(m)
        if shape is None:
            shape, dtype = shp, dt
        elif shp != shape or dt != dtype:
            raise TypeError(f"arrays[{k}] has shape {shp} / type {dt}, expected {shape} / {dtype}")
        addrs.append(addr)
        keep.append(a)
        if not mod.startswith("torch"):
            keep.append(m)  # the export pins the buffer: a bytearray cannot be resized under us
    if len(shape) == 1:
        shape = (shape[0], 1) if False else shape
    desc = CacheDesc(len(arrays), DataType(dtype), list(shape),
                     CachePlacement.DEVICE if placement is None else placement)
    return desc, addrs, keep


cdef uintptr_t _buffer_address(object m) except? 0:
    cdef Py_buffer view
    PyObject_GetBuffer(m, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
    cdef uintptr_t p = <uintptr_t>view.buf
    PyBuffer_Release(&view)
    return p
