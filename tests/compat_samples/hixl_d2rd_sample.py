# SPDX-License-Identifier: Apache-2.0
"""CANN-style hixl sample: a server and a client process (the multi-process D2RD flow), plus a write
and a notification that tells the server its data is there.

    python -m kvblocks.compat hixl_d2rd_sample.py --role server --port P --sync DIR
    python -m kvblocks.compat hixl_d2rd_sample.py --role client --port P --server-port Q --sync DIR

The server fills an 8 MiB buffer with 0xAA, registers it as device memory, and publishes its address
on a side channel (port P + 1000, one big-endian u64). The client reads it as 512 x 16 KiB descs and
checks every byte, writes 0x5A into the server's first 64 KiB and sends a notification; the server
checks, when the notification arrives, that the write has landed.
"""
import argparse
import logging
import socket
import struct
import time
from typing import List, Tuple

import numpy as np

import hixl
from hixl import Hixl, MemDesc, NotifyDesc, TransferOpDesc

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

SIZE = 8 << 20
DESC = 16 << 10
OPTIONS = {hixl.OPTION_AUTO_CONNECT: "1",
           hixl.OPTION_GLOBAL_RESOURCE_CONFIG: '{"comm_resource_config.protocol_desc": ["roce:device"]}'}


def check(what: str, status: int) -> None:
    if status != hixl.SUCCESS:
        raise RuntimeError(f"{what} failed: {status}")


def run_server(port: int) -> None:
    engine = Hixl()
    check("initialize", engine.initialize(f"127.0.0.1:{port}", OPTIONS))
    buf = np.full(SIZE, 0xAA, np.uint8)
    status, handle = engine.register_mem(MemDesc(int(buf.ctypes.data), SIZE), hixl.MEM_DEVICE)
    check("register_mem", status)
    with socket.create_server(("127.0.0.1", port + 1000)) as side:
        conn, _ = side.accept()
        with conn:
            conn.sendall(struct.pack(">Q", int(buf.ctypes.data)))
            deadline = time.monotonic() + 60
            notes: List[NotifyDesc] = []
            while not notes and time.monotonic() < deadline:
                status, notes = engine.get_notifies()
                check("get_notifies", status)
                time.sleep(0.001)
            if [(n.name, n.notify_msg) for n in notes] != [("cache_ready", "0:65536")]:
                raise RuntimeError(f"unexpected notifications {notes}")
            if not (buf[:65536] == 0x5A).all() or not (buf[65536:] == 0xAA).all():
                raise RuntimeError("the notification arrived before the data")
            logging.info("[server] notification after the write verified")
            conn.settimeout(5)
            conn.recv(1)  # the client closes the side channel when it is done with our memory
    check("deregister_mem", engine.deregister_mem(handle))
    engine.finalize()
    logging.info("[server] done")


def fetch_address(port: int) -> Tuple[int, int]:
    """The server's buffer address and the side channel's file descriptor (kept open)."""
    for _ in range(10):
        try:
            with socket.create_connection(("127.0.0.1", port + 1000), timeout=5) as s:
                data = b""
                while len(data) < 8:
                    data += s.recv(8 - len(data))
                addr: int = struct.unpack(">Q", data)[0]
                return addr, s.detach()
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("no server address")


def run_client(port: int, server_port: int) -> None:
    remote_addr, side_fd = fetch_address(server_port)
    server = f"127.0.0.1:{server_port}"
    engine = Hixl()
    check("initialize", engine.initialize(f"127.0.0.1:{port}", OPTIONS))
    buf = np.zeros(SIZE, np.uint8)
    status, handle = engine.register_mem(MemDesc(int(buf.ctypes.data), SIZE), hixl.MEM_DEVICE)
    check("register_mem", status)
    check("connect", engine.connect(server, 5000))
    local = int(buf.ctypes.data)
    descs = [TransferOpDesc(local + o, remote_addr + o, DESC) for o in range(0, SIZE, DESC)]
    assert len(descs) == 512
    check("transfer_sync", engine.transfer_sync(server, hixl.READ, descs, 30000))
    if not (buf == 0xAA).all():
        raise RuntimeError("read data differs")
    logging.info("[client] 8 MiB read verified")
    buf[:65536] = 0x5A
    status, req = engine.transfer_async(server, hixl.WRITE, [TransferOpDesc(local, remote_addr, 65536)])
    check("transfer_async", status)
    check("send_notify", engine.send_notify(server, NotifyDesc("cache_ready", "0:65536"), 5000))
    status, results = engine.get_all_transfer_status()
    check("get_all_transfer_status", status)
    if [(r.req, r.status) for r in results] != [(req, hixl.TransferStatus.COMPLETED)]:
        raise RuntimeError(f"unexpected results {results}")
    check("disconnect", engine.disconnect(server))
    check("deregister_mem", engine.deregister_mem(handle))
    engine.finalize()
    socket.socket(fileno=side_fd).close()
    logging.info("[client] all data verified")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["server", "client"], required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--server-port", type=int, default=0)
    ap.add_argument("--sync", default="")
    a = ap.parse_args()
    if a.role == "server":
        run_server(a.port)
    else:
        run_client(a.port, a.server_port)


if __name__ == "__main__":
    main()
