# SPDX-License-Identifier: Apache-2.0
"""CANN's ``hixl`` engine on kvblocks: address-based transfers between registered memory.

The names, values and signatures are CANN hixl's (Python ``import hixl``); ``python -m
kvblocks.compat`` makes ``import hixl`` resolve to this module. Memory registered as ``MEM_DEVICE``
is served by host memory (there is no accelerator); transfers go over kvblocks' links (in-process
copies, same-host shared memory / cross-memory attach, or TCP), and every local and remote range is
checked against the registrations of both sides before a byte moves. No method raises for a failed
operation: failures are the status codes (generated from hixl_types.h into ``_tables``).
Notifications are at most 1024 bytes of name and of message; an engine queues at most 4096
undelivered ones (all senders together); a notification sent after transfers to the same remote is
delivered after their bytes landed.

kvblocks additions: ``get_all_transfer_status`` is always supported; the environment variable
``KVBLOCKS_TRANSPORT`` (``auto``, ``shm``, ``tcp``) picks the data path, as ``kvblocks.Transport`` does
for LlmDataDist (hixl's option table is closed: unknown options are PARAM_INVALID).
"""
from enum import IntEnum

from kvblocks import _lib

from kvblocks.hixl import _tables
from kvblocks.hixl._tables import *  # noqa: F403  statuses, OPTION_* keys, FEATURE_* (generated from hixl_types.h)


class MemType(IntEnum):
    """Where registered memory lives (device memory is host memory on kvblocks)."""
    MEM_DEVICE = 0
    MEM_HOST = 1


class TransferOp(IntEnum):
    """READ: remote -> local; WRITE: local -> remote."""
    READ = 0
    WRITE = 1


class FeatureType(IntEnum):
    """Features for :func:`get_capability`."""
    AUTO_CONNECT = 0
    CLIENT_SERVER_COMM = 1


class TransferStatus(IntEnum):
    """State of an asynchronous request (TIMEOUT is never produced)."""
    WAITING = 0
    COMPLETED = 1
    TIMEOUT = 2
    FAILED = 3


class AsyncConnectStatus(IntEnum):
    """State of the connect_async / disconnect_async tasks of one remote."""
    NOT_CONNECT = 0
    CONNECT_PENDING = 1
    CONNECTING = 2
    CONNECTED = 3
    CONNECT_FAILED = 4
    DISCONNECT_PENDING = 5
    DISCONNECTING = 6


_lib._hixl_enums.update(TransferStatus=TransferStatus, AsyncConnectStatus=AsyncConnectStatus)

MEM_DEVICE, MEM_HOST = MemType.MEM_DEVICE, MemType.MEM_HOST
READ, WRITE = TransferOp.READ, TransferOp.WRITE
AUTO_CONNECT, CLIENT_SERVER_COMM = FeatureType.AUTO_CONNECT, FeatureType.CLIENT_SERVER_COMM
(NOT_CONNECT, CONNECT_PENDING, CONNECTING, CONNECTED, CONNECT_FAILED, DISCONNECT_PENDING,
 DISCONNECTING) = tuple(AsyncConnectStatus)

MemDesc = _lib.MemDesc
TransferOpDesc = _lib.TransferOpDesc
TransferArgs = _lib.TransferArgs
GetTransferStatusArgs = _lib.GetTransferStatusArgs
TransferResult = _lib.TransferResult
NotifyDesc = _lib.NotifyDesc
Hixl = _lib.Hixl
get_capability = _lib.get_capability

__all__ = [
    "MemType", "MEM_DEVICE", "MEM_HOST", "TransferOp", "READ", "WRITE", "TransferStatus", "AsyncConnectStatus",
    "NOT_CONNECT", "CONNECT_PENDING", "CONNECTING", "CONNECTED", "CONNECT_FAILED", "DISCONNECT_PENDING",
    "DISCONNECTING", "FeatureType", "AUTO_CONNECT", "CLIENT_SERVER_COMM",
    "MemDesc", "TransferOpDesc", "TransferArgs", "GetTransferStatusArgs", "TransferResult", "NotifyDesc",
    "Hixl", "get_capability",
]
__all__ += _tables.__all__
