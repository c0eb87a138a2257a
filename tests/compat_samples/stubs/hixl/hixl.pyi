# Stub of CANN's compiled extension `hixl.hixl` (hixl.md 1.1-1.14): CANN's names and signatures, not
# kvblocks'. Methods return status codes (plain int) and raise only for argument conversion errors.
import enum
from typing import Dict, Final, List, Tuple

SUCCESS: Final = 0
PARAM_INVALID: Final = 103900
TIMEOUT: Final = 103901
NOT_CONNECTED: Final = 103902
ALREADY_CONNECTED: Final = 103903
NOTIFY_FAILED: Final = 103904
UNSUPPORTED: Final = 103905
FAILED: Final = 503900
RESOURCE_EXHAUSTED: Final = 203900

OPTION_ENABLE_USE_FABRIC_MEM: Final = "EnableUseFabricMem"
OPTION_RDMA_TRAFFIC_CLASS: Final = "RdmaTrafficClass"
OPTION_RDMA_SERVICE_LEVEL: Final = "RdmaServiceLevel"
OPTION_BUFFER_POOL: Final = "BufferPool"
OPTION_GLOBAL_RESOURCE_CONFIG: Final = "GlobalResourceConfig"
OPTION_AUTO_CONNECT: Final = "AutoConnect"
OPTION_LOCAL_COMM_RES: Final = "LocalCommRes"

FEATURE_SUPPORTED: Final = 1
FEATURE_NOT_SUPPORTED: Final = 0

# Unscoped C++ enums upstream (pybind11): equal to their int values.
class MemType(enum.IntEnum):
    MEM_DEVICE = 0
    MEM_HOST = 1

class TransferOp(enum.IntEnum):
    READ = 0
    WRITE = 1

class FeatureType(enum.IntEnum):
    AUTO_CONNECT = 0
    CLIENT_SERVER_COMM = 1

# Scoped C++ enums upstream: equal only to their own members; int() works.
class TransferStatus(enum.Enum):
    WAITING = 0
    COMPLETED = 1
    TIMEOUT = 2
    FAILED = 3
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...

class AsyncConnectStatus(enum.Enum):
    NOT_CONNECT = 0
    CONNECT_PENDING = 1
    CONNECTING = 2
    CONNECTED = 3
    CONNECT_FAILED = 4
    DISCONNECT_PENDING = 5
    DISCONNECTING = 6
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...

# Exported members (TransferStatus' are not exported: hixl.TIMEOUT/hixl.FAILED are status codes).
MEM_DEVICE: Final = MemType.MEM_DEVICE
MEM_HOST: Final = MemType.MEM_HOST
READ: Final = TransferOp.READ
WRITE: Final = TransferOp.WRITE
NOT_CONNECT: Final = AsyncConnectStatus.NOT_CONNECT
CONNECT_PENDING: Final = AsyncConnectStatus.CONNECT_PENDING
CONNECTING: Final = AsyncConnectStatus.CONNECTING
CONNECTED: Final = AsyncConnectStatus.CONNECTED
CONNECT_FAILED: Final = AsyncConnectStatus.CONNECT_FAILED
DISCONNECT_PENDING: Final = AsyncConnectStatus.DISCONNECT_PENDING
DISCONNECTING: Final = AsyncConnectStatus.DISCONNECTING
AUTO_CONNECT: Final = FeatureType.AUTO_CONNECT
CLIENT_SERVER_COMM: Final = FeatureType.CLIENT_SERVER_COMM

class MemDesc:
    addr: int
    len: int
    def __init__(self, addr: int, len: int) -> None: ...

class TransferOpDesc:
    local_addr: int
    remote_addr: int
    len: int
    def __init__(self, local_addr: int, remote_addr: int, len: int) -> None: ...

class TransferArgs:
    user_data: int
    def __init__(self) -> None: ...

class GetTransferStatusArgs:
    max_query_count: int
    skip_waiting: bool
    def __init__(self, max_query_count: int = 4294967295, skip_waiting: bool = False) -> None: ...

class TransferResult:
    req: int
    user_data: int
    @property
    def status(self) -> TransferStatus: ...
    def __init__(self) -> None: ...

class NotifyDesc:
    name: str
    notify_msg: str
    def __init__(self, name: str, notify_msg: str) -> None: ...

class Hixl:
    def __init__(self) -> None: ...
    def initialize(self, local_engine: str, options: Dict[str, str] = ...) -> int: ...
    def finalize(self) -> None: ...
    def register_mem(self, mem_desc: MemDesc, mem_type: MemType, /) -> Tuple[int, int]: ...
    def deregister_mem(self, mem_handle: int, /) -> int: ...
    def connect(self, remote_engine: str, timeout_in_millis: int = 1000) -> int: ...
    def disconnect(self, remote_engine: str, timeout_in_millis: int = 1000) -> int: ...
    def connect_async(self, remote_engine: str, timeout_in_millis: int = 1000) -> int: ...
    def disconnect_async(self, remote_engine: str, timeout_in_millis: int = 1000) -> int: ...
    def get_async_connect_status(self, remote_engine: str, /) -> Tuple[int, AsyncConnectStatus]: ...
    def get_all_async_connect_status(self) -> Tuple[int, Dict[str, AsyncConnectStatus]]: ...
    def transfer_sync(self, remote_engine: str, op: TransferOp, op_descs: List[TransferOpDesc],
                      timeout_in_millis: int = 1000) -> int: ...
    def transfer_async(self, remote_engine: str, op: TransferOp, op_descs: List[TransferOpDesc],
                       args: TransferArgs = ...) -> Tuple[int, int]: ...
    def get_transfer_status(self, req: int, /) -> Tuple[int, TransferStatus]: ...
    def get_all_transfer_status(self, args: GetTransferStatusArgs = ...) -> Tuple[int, List[TransferResult]]: ...
    def send_notify(self, remote_engine: str, notify: NotifyDesc, timeout_in_millis: int = 1000) -> int: ...
    def get_notifies(self) -> Tuple[int, List[NotifyDesc]]: ...

def get_capability(feature_type: FeatureType) -> Tuple[int, int]: ...
