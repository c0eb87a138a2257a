# SPDX-License-Identifier: Apache-2.0
"""A hand-written client that speaks the kvblocks wire protocol (docs/protocol.md) directly."""
import os
import socket
import struct

MAGIC = 0x3142564B
VERSION = 2
CAP_TCP = 1
HDR = struct.Struct("<IHHIIQ")
HELLO, CHALLENGE, AUTH, HELLO_ACK, CONFIRM, CONFIRM_ACK = 1, 2, 3, 4, 5, 6
READ_REQ, READ_RESP, WRITE_REQ, WRITE_READY, WRITE_DONE, ERROR = 20, 21, 22, 23, 24, 30


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def send_frame(s, type_, payload=b"", status=0, flags=0, length=None):
    s.sendall(HDR.pack(MAGIC, type_, flags, status, 0, len(payload) if length is None else length) + payload)


def recv_frame(s):
    magic, type_, flags, status, _, length = HDR.unpack(recv_exact(s, HDR.size))
    assert magic == MAGIC
    return type_, status, recv_exact(s, length) if length else b""


def handshake(port, kind, cluster_id, token=b"\0" * 16, extra=b"", ip="127.0.0.1"):
    s = socket.create_connection((ip, port), timeout=5)
    send_frame(s, HELLO, struct.pack("<IIQ", VERSION, kind, cluster_id) + os.urandom(16) + token + extra)
    t, _, _ = recv_frame(s)
    assert t == CHALLENGE
    send_frame(s, AUTH, b"\0" * 33)
    t, status, payload = recv_frame(s)
    assert t == HELLO_ACK
    return s, status, payload


def open_link(port, cluster_id=77):
    """Control handshake with a made-up identity; returns (ctrl socket, link token)."""
    identity = b"\0" * 16 + struct.pack("<QIQQQ", 0, 0, 0, 0, 0)
    info = struct.pack("<Q", CAP_TCP) + identity + struct.pack("<q", 0) + struct.pack("<I", 0)  # no caches
    ctrl, status, payload = handshake(port, 1, cluster_id, extra=info)
    assert status == 0
    token = payload[8:24]  # HELLO_ACK: cluster_id u64, link_token[16], link info
    send_frame(ctrl, CONFIRM, struct.pack("<q", 0))
    t, status, _ = recv_frame(ctrl)
    assert t == CONFIRM_ACK and status == 0
    return ctrl, token


def request(cache_id, tensors, segments, data_len=None, deadline=2**62, budget=10**10):
    total = sum(l for _, l in segments) * len(tensors) if data_len is None else data_len
    body = struct.pack("<qqqIIQ", cache_id, deadline, budget, len(tensors), len(segments), total)
    body += b"".join(struct.pack("<I", t) for t in tensors)
    body += b"".join(struct.pack("<QQ", o, l) for o, l in segments)
    return body
