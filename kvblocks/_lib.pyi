# SPDX-License-Identifier: Apache-2.0
# Type stubs for the Cython core (kvblocks/_lib.pyx).
import enum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, TypedDict, Union

_Blocks = Union[Sequence[int], Any]  # list/tuple of int, array('Q'), numpy integer arrays


class LlmRole(enum.IntEnum):
    PROMPT = 1
    DECODER = 2
    MIX = 3

class CachePlacement(enum.IntEnum):
    HOST = 0
    DEVICE = 1

class DataType(enum.IntEnum):
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

class CacheDesc:
    num_tensors: int
    data_type: DataType
    shape: Tuple[int, ...]
    placement: CachePlacement
    def __init__(self, num_tensors: int = ..., data_type: DataType = ..., shape: Sequence[int] = ...,
                 placement: CachePlacement = ...) -> None: ...
    @property
    def tensor_bytes(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...

class CacheIndex:
    cluster_id: int
    cache_id: int
    batch_index: int
    def __init__(self, cluster_id: int, cache_id: int, batch_index: int = ...) -> None: ...

class KvCacheExtParam:
    src_layer_range: Tuple[int, int]
    dst_layer_range: Tuple[int, int]
    tensor_num_per_layer: int
    def __init__(self, src_layer_range: Tuple[int, int] = ..., dst_layer_range: Tuple[int, int] = ...,
                 tensor_num_per_layer: int = ...) -> None: ...

class IpInfo:
    ip: str
    port: int
    def __init__(self, ip: str = ..., port: int = ...) -> None: ...

class ClusterInfo:
    remote_cluster_id: int
    remote_role_type: int
    local_ip_infos: List[IpInfo]
    remote_ip_infos: List[IpInfo]
    def __init__(self, remote_cluster_id: int = ..., remote_role_type: int = ...,
                 local_ip_infos: Optional[Sequence[IpInfo]] = ...,
                 remote_ip_infos: Optional[Sequence[IpInfo]] = ...) -> None: ...

class Cache:
    @property
    def cache_id(self) -> int: ...
    @property
    def cache_desc(self) -> CacheDesc: ...
    @property
    def tensor_addrs(self) -> List[int]: ...
    @property
    def is_blocks_cache(self) -> bool: ...
    @property
    def num_blocks(self) -> int: ...
    def tensor(self, i: int) -> memoryview: ...
    def numpy(self, i: int) -> Any: ...

_CacheRef = Union[Cache, int]

class LinkFailure(NamedTuple):
    reason: str
    status: int
    message: str

LINK_FAILURE_REASONS: Tuple[str, ...]

def route_logs_to_python(enable: bool = ...) -> None: ...
# LlmDataDist.metrics() / kvblocks.metrics() (README "Metrics"; C++: include/kvblocks/metrics.h).
class KindMetrics(TypedDict):
    kind: str  # pull_blocks, push_blocks, pull_cache, push_cache, pull_blocks_async, push_blocks_async,
               # push_layerwise, hixl_read, hixl_write, hixl_read_async, hixl_write_async
    count: int  # finished, any status
    bytes: int  # moved by the successful ones
    seconds_sum: float
    status: Dict[str, int]  # "success", "timeout", "kv_cache_not_exist", ... -> count
    buckets: List[int]  # per bucket of EngineMetrics.bucket_bounds, then +Inf (not cumulative)

class PathMetrics(TypedDict):
    path: str  # the path's name ("inprocess", "shm", "cma", "tcp", "ucx"); "none": failed before a path
    in_flight: int
    bytes_in: int
    bytes_out: int
    kinds: List[KindMetrics]

class PeerMetrics(TypedDict):
    peer: Optional[int]  # remote cluster id; None: calls that failed before finding a link
    linked: bool
    data_channels: int
    links: int
    relinks: int
    unlinks: int
    link_failures: int
    link_breaks: int
    notifies_sent: int
    notifies_received: int
    timeouts: int
    crc_mismatches: int  # kvblocks.Integrity=crc32c: checks that failed on this side
    paths: List[PathMetrics]

class EngineMetrics(TypedDict):
    version: int  # 1
    cluster_id: int
    caches: int
    cache_bytes: int
    bucket_bounds: List[float]  # upper bounds in seconds, 1e-6 .. 100, 4 per decade
    peers: List[PeerMetrics]

class LlmDataDist:
    @property
    def cluster_id(self) -> int: ...
    def __init__(self, cluster_id: int, role: LlmRole) -> None: ...
    @property
    def role(self) -> LlmRole: ...
    def initialize(self, options: Dict[str, str]) -> None: ...
    def finalize(self) -> None: ...
    def set_role(self, role: LlmRole, options: Optional[Dict[str, str]] = ...) -> None: ...
    def link_llm_clusters(self, clusters: Sequence[ClusterInfo], timeout_in_millis: int = ...) -> List[int]: ...
    def unlink_llm_clusters(self, clusters: Sequence[ClusterInfo], timeout_in_millis: int = ...,
                            force: bool = ...) -> List[int]: ...
    def allocate_cache(self, desc: CacheDesc) -> Cache: ...
    def register_kv_cache(self, desc: CacheDesc, addrs: Sequence[int]) -> Cache: ...
    def register_arrays(self, arrays: Sequence[Any], *, placement: Optional[CachePlacement] = ...) -> Cache: ...
    def deallocate_cache(self, cache: _CacheRef) -> None: ...
    def unregister_kv_cache(self, cache: _CacheRef) -> None: ...
    def pull_kv_blocks(self, src_index: CacheIndex, dst_cache: _CacheRef, src_blocks: _Blocks, dst_blocks: _Blocks,
                       ext_param: Optional[KvCacheExtParam] = ...) -> None: ...
    def push_kv_blocks(self, src_cache: _CacheRef, dst_index: CacheIndex, src_blocks: _Blocks, dst_blocks: _Blocks,
                       ext_param: Optional[KvCacheExtParam] = ...) -> None: ...
    def pull_kv_cache(self, src_index: CacheIndex, dst_cache: _CacheRef, batch_index: int = ..., size: int = ...,
                      ext_param: Optional[KvCacheExtParam] = ...) -> None: ...
    def push_kv_cache(self, src_cache: _CacheRef, dst_index: CacheIndex, src_batch_index: int = ...,
                      size: int = ..., ext_param: Optional[KvCacheExtParam] = ...) -> None: ...
    def copy_kv_blocks(self, src_cache: _CacheRef, dst_cache: _CacheRef, src_blocks: _Blocks,
                       dst_blocks_list: Sequence[_Blocks]) -> None: ...
    def copy_kv_cache(self, src_cache: _CacheRef, dst_cache: _CacheRef, src_batch_index: int = ...,
                      dst_batch_index: int = ..., offset: int = ..., size: int = ...) -> None: ...
    def pull_kv_blocks_async(self, src_index: CacheIndex, dst_cache: _CacheRef, src_blocks: _Blocks,
                             dst_blocks: _Blocks, ext_param: Optional[KvCacheExtParam] = ...) -> TransferHandle: ...
    def push_kv_blocks_async(self, src_cache: _CacheRef, dst_index: CacheIndex, src_blocks: _Blocks,
                             dst_blocks: _Blocks, ext_param: Optional[KvCacheExtParam] = ...) -> TransferHandle: ...
    def pull_kv_blocks_batch(self, requests: Sequence[Union[Tuple[Any, ...], Dict[str, Any]]]) -> List[TransferHandle]: ...
    def push_kv_blocks_batch(self, requests: Sequence[Union[Tuple[Any, ...], Dict[str, Any]]]) -> List[TransferHandle]: ...
    def open_layer_push(self, src_cache: _CacheRef, dst_index: CacheIndex, src_blocks: _Blocks,
                        dst_blocks: _Blocks, tensor_num_per_layer: int = ...) -> LayerPush: ...
    def _open_layer_push_pieces(self, src_cache: _CacheRef, dst_cluster_id: int, num_layers: int,
                                pieces: Sequence[Tuple[Any, ...]], per_layer_deadline: bool = ...) -> LayerPush: ...
    def prepare_transfer(self, remote: CacheIndex, local_cache: _CacheRef, src_blocks: _Blocks, dst_blocks: _Blocks,
                         *, pull: bool = ..., ext_param: Optional[KvCacheExtParam] = ...,
                         src_layout: Optional[BlockLayout] = ..., dst_layout: Optional[BlockLayout] = ...,
                         src_heads: Optional[Tuple[int, int]] = ...,
                         dst_heads: Optional[Tuple[int, int]] = ...) -> PreparedTransfer: ...
    def pull_kv_blocks_layout(self, src_index: CacheIndex, dst_cache: _CacheRef, src_blocks: _Blocks,
                              dst_blocks: _Blocks, src_layout: BlockLayout, dst_layout: BlockLayout,
                              src_heads: Optional[Tuple[int, int]] = ..., dst_heads: Optional[Tuple[int, int]] = ...,
                              ext_param: Optional[KvCacheExtParam] = ...) -> None: ...
    def push_kv_blocks_layout(self, src_cache: _CacheRef, dst_index: CacheIndex, src_blocks: _Blocks,
                              dst_blocks: _Blocks, src_layout: BlockLayout, dst_layout: BlockLayout,
                              src_heads: Optional[Tuple[int, int]] = ..., dst_heads: Optional[Tuple[int, int]] = ...,
                              ext_param: Optional[KvCacheExtParam] = ...) -> None: ...
    def link_failure(self, cluster_id: int) -> Optional[LinkFailure]: ...
    @property
    def listen_address(self) -> Optional[str]: ...
    def link_path(self, cluster_id: int) -> str: ...
    def metrics(self) -> EngineMetrics: ...
    def send_notify(self, cluster_id: int, name: Union[str, bytes], message: Union[str, bytes],
                    timeout_in_millis: int = ...) -> None: ...
    def get_notifies(self) -> List[Tuple[int, str, str]]: ...
    def _add_cache(self, desc: CacheDesc, addrs: Optional[Sequence[int]], kind: int, key: int,
                   keepalive: Any) -> Cache: ...
    def _find_remote_cache(self, cluster_id: int, key: int) -> int: ...
    def _describe_remote_cache(self, cluster_id: int, cache_id: int) -> Dict[str, Any]: ...
    def _link_channels(self, cluster_id: int) -> int: ...

def process_metrics() -> List[EngineMetrics]: ...
def validate_blocks(src_blocks: _Blocks, dst_blocks: _Blocks, num_blocks: int) -> None: ...
def _describe_arrays(arrays: Sequence[Any], placement: Optional[CachePlacement]) -> Tuple[CacheDesc, List[int], List[Any]]: ...
def __getattr__(name: str) -> Any: ...

class TransferHandle:
    def wait(self, timeout: Optional[float] = ...) -> None: ...
    def done(self) -> bool: ...
    @property
    def status(self) -> Optional[int]: ...

def wait_all(handles: Sequence[TransferHandle], timeout: Optional[float] = ...) -> None: ...

class BlockLayout:
    tokens_per_block: int
    kv_heads: int
    head_size: int
    elem_size: int
    order: str
    def __init__(self, tokens_per_block: int, kv_heads: int, head_size: int, elem_size: int,
                 order: str = ...) -> None: ...
    @property
    def block_bytes(self) -> int: ...

class PreparedTransfer:
    @property
    def bytes(self) -> int: ...
    @property
    def segments(self) -> int: ...
    @property
    def pairs(self) -> int: ...
    def execute(self) -> None: ...
    def execute_async(self) -> TransferHandle: ...

class LayerPush:
    @property
    def num_layers(self) -> int: ...
    @property
    def layers_sent(self) -> int: ...
    def layer_ready(self, layer: int) -> None: ...
    def finish(self, timeout: Optional[float] = ...) -> None: ...
    def abort(self) -> int: ...
    def drain(self) -> Optional[int]: ...
    def done(self) -> bool: ...
    @property
    def status(self) -> Optional[int]: ...
    def __enter__(self) -> "LayerPush": ...
    def __exit__(self, *exc: Any) -> bool: ...
