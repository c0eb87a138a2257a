# SPDX-License-Identifier: Apache-2.0
"""A listener that speaks the local exchange as kvblocks did before it stated its control connection's
ends (docs/protocol.md "Same host"), run as its own process: ``old_local_peer.py``.

It is honest about everything else: its identity (boot id, network namespace, a probe word in its
own memory), one cache at a buffer of its own, and the local exchange answered with the opener's key
from its own process. It prints ``{"port": ..., "addr": ...}`` and runs until its stdin closes.
"""
import ctypes
import json
import os
import socket
import struct
import sys
import threading

from hostile import (AUTH, BIND, CHALLENGE, CONFIRM, CONFIRM_ACK, HELLO, HELLO_ACK, LINK_INFO, identity, link_info,
                     parse_link_info, recv_frame, send_frame)
from relay import CACHE_ID, CLUSTER, entry_at

CAPS = 1 | 2 | 4 | 32  # tcp, shared memory, CMA, cache queries
SIZE = 4096
buf = ctypes.create_string_buffer((b"OLD-PEER-OWN-MEMORY" * (SIZE // 19 + 1))[:SIZE], SIZE)
probe = ctypes.c_uint64(int.from_bytes(os.urandom(8), "little"))


def my_identity():
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = bytes.fromhex(f.read().strip().replace("-", ""))
    return identity(boot, os.stat("/proc/self/ns/net").st_ino, 1, ctypes.addressof(probe), probe.value)


def old_exchange(lfd, opener_key):
    """Accepts the opener, reads its message, answers in the old format: length, key, count (no ends)."""
    c, _ = lfd.accept()
    c.settimeout(5)
    c.recv(65536)  # its message (whatever its format); the memfds that came with it are dropped unread
    c.sendall(struct.pack("<I", 20) + opener_key + struct.pack("<I", 0))
    return c


def serve(s):
    _, _, hello = recv_frame(s)
    kind, = struct.unpack_from("<I", hello, 4)
    send_frame(s, CHALLENGE, os.urandom(16) + bytes(34))
    recv_frame(s)  # AUTH
    send_frame(s, HELLO_ACK)
    if kind != 1:
        recv_frame(s)  # BIND
        send_frame(s, BIND)
        return s
    _, _, payload = recv_frame(s)
    theirs = parse_link_info(payload)
    lfd = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"kvblocks-old-{os.getpid()}-{os.urandom(4).hex()}".encode()
    lfd.bind(b"\0" + name)
    lfd.listen(1)
    send_frame(s, LINK_INFO, link_info(CLUSTER, caps=CAPS, ident=my_identity(), local_name=name,
                                       local_key=os.urandom(16), link_token=os.urandom(16),
                                       table=struct.pack("<I", 1) + entry_at(ctypes.addressof(buf), SIZE)))
    t, _, confirm = recv_frame(s)
    assert t == CONFIRM
    keep = old_exchange(lfd, theirs["local_key"]) if confirm[8] else None
    send_frame(s, CONFIRM_ACK)
    return s, keep


def main():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def accept():
        while True:
            s, _ = srv.accept()
            s.settimeout(10)
            try:
                held.append(serve(s))
            except (ConnectionError, OSError, AssertionError, struct.error):
                s.close()

    threading.Thread(target=accept, daemon=True).start()
    print(json.dumps({"port": srv.getsockname()[1], "addr": ctypes.addressof(buf)}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
