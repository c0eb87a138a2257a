# SPDX-License-Identifier: Apache-2.0
"""A ceiling for same-host LMCache transfer channels, run inside LMCache's own benchmark.

``python bench/lmcache_ceiling.py benchmark [transfer_channel_benchmark options]`` registers a channel
named ``cma-ceiling`` and runs ``lmcache.tools.transfer_channel_benchmark``. Its read is one
``process_vm_readv`` of all objects, made inside ``submit_read`` (so the read is finished before the
benchmark's first poll): no thread, no queue, no check, no auth. It is what any channel that copies with
cross-memory attach can reach on LMCache's L1 arenas (a ``/dev/shm`` file mapped in each process) in this
benchmark's loop; measurement only, never a channel to serve with. The peer's pid and arena address come
from a line its context serves on the listen url.
"""
import ctypes
import json
import os
import socket
import sys
import threading
from typing import Any, Dict, List, Tuple

from lmcache.v1.distributed.transfer_channel.abstract import (
    TransferChannelClient,
    TransferChannelContext,
    TransferChannelServer,
)
from lmcache.v1.distributed.transfer_channel.api import TransferChannelAddress, TransferChannelReadResult

NAME = "cma-ceiling"
_libc = ctypes.CDLL(None, use_errno=True)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
                                   ctypes.c_ulong, ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t
_IOV_MAX = 1024


def _hostport(url: str) -> Tuple[str, int]:
    host, _, port = url.rpartition(":")
    return host, int(port)


class _Server(TransferChannelServer):
    """Answers one JSON line ``{"pid", "ptr"}`` per connection on the listen url."""

    def __init__(self, listen_url: str, ptr: int) -> None:
        self._sock = socket.create_server(_hostport(listen_url))
        self._line = (json.dumps({"pid": os.getpid(), "ptr": ptr}) + "\n").encode()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self._line)

    def close(self) -> None:
        self._sock.close()


class _Client(TransferChannelClient):
    def __init__(self, url: str, local_ptr: int) -> None:
        with socket.create_connection(_hostport(url), timeout=10) as s:
            peer = json.loads(s.makefile().readline())
        self._pid, self._remote, self._local = peer["pid"], peer["ptr"], local_ptr
        self._results: Dict[int, List[bool]] = {}
        self._next = 0

    def submit_read(self, local_addresses: List[TransferChannelAddress],
                    remote_addresses: List[TransferChannelAddress]) -> int:
        n = len(local_addresses)
        ok = True
        for i in range(0, n, _IOV_MAX):
            lo, ro = local_addresses[i:i + _IOV_MAX], remote_addresses[i:i + _IOV_MAX]
            liov = (_Iovec * len(lo))(*[_Iovec(self._local + a.offset, a.size) for a in lo])
            riov = (_Iovec * len(ro))(*[_Iovec(self._remote + a.offset, a.size) for a in ro])
            want = sum(a.size for a in lo)
            ok = ok and _libc.process_vm_readv(self._pid, liov, len(lo), riov, len(ro), 0) == want
        tid, self._next = self._next, self._next + 1
        self._results[tid] = [ok] * n
        return tid

    def query_read_status(self, task_id: int) -> TransferChannelReadResult:
        return TransferChannelReadResult(finished=True, succeeded_mask=self._results.pop(task_id))

    def close(self) -> None:
        pass


class CeilingContext(TransferChannelContext):
    def __init__(self, l1_memory_desc: Any, listen_url: str, advertise_url: str, **_ignored: Any) -> None:
        self._ptr = int(l1_memory_desc.ptr)
        self._server = _Server(listen_url, self._ptr)
        self._clients: Dict[str, _Client] = {}

    def get_transfer_channel_server(self) -> TransferChannelServer:
        return self._server

    def get_transfer_channel_client(self, peer_advertise_url: str) -> TransferChannelClient:
        if peer_advertise_url not in self._clients:
            self._clients[peer_advertise_url] = _Client(peer_advertise_url, self._ptr)
        return self._clients[peer_advertise_url]

    def remove_transfer_channel_client(self, peer_advertise_url: str) -> None:
        self._clients.pop(peer_advertise_url, None)

    def get_transfer_channel_address(self, lmcache_addresses: List[Tuple[int, int]]) -> List[TransferChannelAddress]:
        return [TransferChannelAddress(offset=int(o), size=int(s)) for o, s in lmcache_addresses]

    def get_num_connected_clients(self) -> int:
        return len(self._clients)

    def close(self) -> None:
        self._server.close()


def main(argv: List[str]) -> None:
    import runpy

    from lmcache.v1.distributed.transfer_channel import factory

    factory.register_transfer_channel_factory(NAME, CeilingContext)
    if not argv or argv[0] != "benchmark":
        raise SystemExit("usage: python bench/lmcache_ceiling.py benchmark [transfer_channel_benchmark options]")
    sys.argv = ["lmcache.tools.transfer_channel_benchmark"] + argv[1:]
    runpy.run_module("lmcache.tools.transfer_channel_benchmark", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
