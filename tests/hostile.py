# SPDX-License-Identifier: Apache-2.0
"""A hand-written client that speaks the kvblocks wire protocol (docs/protocol.md) directly."""
import os
import socket
import struct

MAGIC = 0x3142564B
VERSION = 4
CAP_TCP = 1
HDR = struct.Struct("<IHHIIQ")
HELLO, CHALLENGE, AUTH, HELLO_ACK, CONFIRM, CONFIRM_ACK, BIND, LINK_INFO = 1, 2, 3, 4, 5, 6, 7, 8
UNLINK, UNLINK_ACK, OPEN_REVERSE, REVERSE_REFUSED = 10, 11, 12, 15
FLAG_CROSSING = 2
READ_REQ, READ_RESP, WRITE_REQ, WRITE_READY, WRITE_DONE, ERROR = 20, 21, 22, 23, 24, 30
CACHE_QUERY, CACHE_INFO = 25, 26
UCX_INFO = 27  # after CONFIRM, between two sides offering CAP_UCX
CAP_UCX = 128
CAP_CACHE_QUERY = 32
CAP_KEY_QUERY = 64
QUERY_BY_CACHE_KEY, QUERY_BY_BATCH_KEY = 2, 3
TABLE_ENTRY = struct.Struct("<qBqIQQQQH")  # id, kind, key, num_tensors, tensor_bytes, num_blocks, batch, stride, n_desc


def table_entry(cache_id, num_tensors=1, tensor_bytes=64, num_blocks=1, batch_size=1, stride=64, kind=0, key=-1,
                descriptors=b"", n_desc=0):
    """One cache-table entry (docs/protocol.md), with whatever sizes the caller makes up."""
    return TABLE_ENTRY.pack(cache_id, kind, key, num_tensors, tensor_bytes, num_blocks, batch_size, stride,
                            n_desc) + descriptors


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def data_pad(before):
    """The zeros between a frame's first ``before`` bytes and its data (READ_RESP, inline WRITE_REQ):
    the data starts at a multiple of 64 bytes into the frame (protocol.md)."""
    return -before % 64


def send_frame(s, type_, payload=b"", status=0, flags=0, length=None):
    """One frame; an inline WRITE_REQ (flags bit 0) gets the pad its data must follow."""
    pad = bytes(data_pad(HDR.size + len(payload))) if type_ == WRITE_REQ and flags & 1 else b""
    s.sendall(HDR.pack(MAGIC, type_, flags, status, 0, len(payload) if length is None else length) + payload + pad)


def recv_frame(s):
    """(type, status, payload); for a READ_RESP with data the payload is the data, its pad skipped,
    and after an inline WRITE_REQ the pad before its data is consumed too."""
    magic, type_, flags, status, _, length = HDR.unpack(recv_exact(s, HDR.size))
    assert magic == MAGIC
    if type_ == READ_RESP and status == 0:
        recv_exact(s, data_pad(HDR.size))
    payload = recv_exact(s, length) if length else b""
    if type_ == WRITE_REQ and flags & 1:
        recv_exact(s, data_pad(HDR.size + length))
    return type_, status, payload


def authenticate(port, kind, cluster_id, ip="127.0.0.1"):
    """HELLO .. HELLO_ACK without a token; returns (socket, HELLO_ACK status)."""
    s = socket.create_connection((ip, port), timeout=5)
    send_frame(s, HELLO, struct.pack("<IIQ", VERSION, kind, cluster_id) + os.urandom(16))
    t, _, _ = recv_frame(s)
    assert t == CHALLENGE
    send_frame(s, AUTH, b"\0" * 33)
    t, status, _ = recv_frame(s)
    assert t == HELLO_ACK
    return s, status


def identity(boot_id=b"\0" * 16, netns=0, instance=0, probe_addr=0, probe_value=0):
    return boot_id + struct.pack("<QQQQ", netns, instance, probe_addr, probe_value)


def link_info(cluster_id, caps=CAP_TCP, ident=None, clock=0, local_name=b"", local_key=b"\0" * 16,
              table=struct.pack("<I", 0), link_token=b"\0" * 16, proof=b"\0" * 32):
    """A LINK_INFO payload (docs/protocol.md), with whatever identity and table the caller makes up."""
    return (struct.pack("<Q", cluster_id) + link_token + struct.pack("<Q", caps) + (ident or identity()) +
            struct.pack("<q", clock) + bytes([len(local_name)]) + local_name + local_key + table + proof)


def parse_link_info(payload):
    """The fields of a LINK_INFO payload a test looks at."""
    cluster_id, = struct.unpack_from("<Q", payload, 0)
    token = payload[8:24]
    caps, = struct.unpack_from("<Q", payload, 24)
    ident = payload[32:80]
    off = 80 + 8
    name = payload[off + 1:off + 1 + payload[off]]
    off += 1 + len(name)
    key = payload[off:off + 16]
    return dict(cluster_id=cluster_id, token=token, caps=caps, identity=ident, local_name=name, local_key=key,
                table=payload[off + 16:-32], proof=payload[-32:])


def handshake(port, kind, cluster_id, token=b"\0" * 16, info=None, ip="127.0.0.1"):
    """A whole handshake: LINK_INFO on control connections (kind 1), BIND on data channels."""
    s, status = authenticate(port, kind, cluster_id, ip)
    assert status == 0
    if kind == 1:
        send_frame(s, LINK_INFO, link_info(cluster_id) if info is None else info)
        t, status, payload = recv_frame(s)
        assert t == LINK_INFO
    else:
        send_frame(s, BIND, token)
        t, status, payload = recv_frame(s)
        assert t == BIND
    return s, status, payload


def open_link(port, cluster_id=77, caps=CAP_TCP):
    """Control handshake with a made-up identity and no caches; returns (ctrl socket, link token)."""
    ctrl, status, payload = handshake(port, 1, cluster_id, info=link_info(cluster_id, caps=caps))
    assert status == 0
    token = payload[8:24]  # LINK_INFO: cluster_id u64, link_token[16], link info, proof
    send_frame(ctrl, CONFIRM, struct.pack("<qB", 0, 0))
    t, status, _ = recv_frame(ctrl)
    assert t == CONFIRM_ACK and status == 0
    return ctrl, token


def request(cache_id, tensors, segments, data_len=None, deadline=2**62, budget=10**10):
    total = sum(l for _, l in segments) * len(tensors) if data_len is None else data_len
    body = struct.pack("<qqqIIQ", cache_id, deadline, budget, len(tensors), len(segments), total)
    body += b"".join(struct.pack("<I", t) for t in tensors)
    body += b"".join(struct.pack("<QQ", o, l) for o, l in segments)
    return body
