# SPDX-License-Identifier: Apache-2.0
"""A hand-written client that speaks the kvblocks wire protocol (docs/protocol.md) directly."""
import hashlib
import hmac
import ipaddress
import os
import socket
import struct

MAGIC = 0x3142564B
VERSION = 5
CAP_TCP = 1
HDR = struct.Struct("<IHHIIQ")
HELLO, CHALLENGE, AUTH, HELLO_ACK, CONFIRM, CONFIRM_ACK, BIND, LINK_INFO = 1, 2, 3, 4, 5, 6, 7, 8
UNLINK, UNLINK_ACK, OPEN_REVERSE, REVERSE_REFUSED = 10, 11, 12, 15
FLAG_CROSSING = 2
READ_REQ, READ_RESP, WRITE_REQ, WRITE_READY, WRITE_DONE, ERROR = 20, 21, 22, 23, 24, 30
CACHE_QUERY, CACHE_INFO = 25, 26
NOTIFY = 16
BACKEND_ATTACH = 27  # after CONFIRM, per backend both sides offered that exchanges: its id byte, then its data
UCX_INFO = BACKEND_ATTACH  # UCX's: id UCX_ID (its capability bit's index), then UCX_INFO proper
UCX_ID = 7
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


OPENER_LABEL, LISTENER_LABEL, BIND_LABEL = b"kvblocks-v5-opener", b"kvblocks-v5-listener", b"kvblocks-v5-bind"


def endpoint(ip=None, port=0):
    """The listener-address field of a transcript: family u8, ip[16], port u16 (all zero: none, as
    without a token); IPv4 and IPv4-mapped IPv6 are family 4."""
    if ip is None:
        return bytes(19)
    a = ipaddress.ip_address(ip)
    if a.version == 6 and a.ipv4_mapped:
        a = a.ipv4_mapped
    return bytes([a.version]) + a.packed.ljust(16, b"\0") + struct.pack("<H", port)


def transcript(kind, opener, listener, client_nonce, server_nonce, where=None, version=VERSION):
    """What every proof of a connection covers (docs/protocol.md, "Handshake"), 75 bytes."""
    where = endpoint() if where is None else where
    return struct.pack("<IIQQ", version, kind, opener, listener) + client_nonce + server_nonce + where


def mac(key, label, tr):
    """HMAC-SHA256(key, len(label) u8 || label || transcript): every proof and BIND."""
    return hmac.new(key, bytes([len(label)]) + label + tr, hashlib.sha256).digest()


# The cluster id of each listener (ip, port) a control handshake here learned from its LINK_INFO:
# a data channel's BIND names it.
_listener_ids = {}


def authenticate(port, kind, cluster_id, ip="127.0.0.1", src=None):
    """HELLO .. HELLO_ACK without a token; returns (socket, HELLO_ACK status). ``src``: the local
    address to connect from (on loopback, 127.0.0.2 etc. is another peer address)."""
    s, status, _ = authenticate_nonces(port, kind, cluster_id, ip, src)
    return s, status


def authenticate_nonces(port, kind, cluster_id, ip="127.0.0.1", src=None):
    """authenticate(), and the nonces a BIND names: (socket, HELLO_ACK status, (client nonce, server nonce))."""
    s = socket.create_connection((ip, port), timeout=5, source_address=(src, 0) if src else None)
    nonce = os.urandom(16)
    send_frame(s, HELLO, struct.pack("<IIQ", VERSION, kind, cluster_id) + nonce)
    t, _, challenge = recv_frame(s)
    assert t == CHALLENGE
    send_frame(s, AUTH, b"\0" * 33)
    t, status, _ = recv_frame(s)
    assert t == HELLO_ACK
    return s, status, (nonce, challenge[:16])


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


def handshake(port, kind, cluster_id, token=b"\0" * 16, info=None, ip="127.0.0.1", listener=None, src=None):
    """A whole handshake without an AuthToken: LINK_INFO on control connections (kind 1), BIND on data
    channels: the MAC of this connection's transcript under the link `token`, naming the listener's
    cluster id `listener` (default: the one an earlier control handshake to that address learned)."""
    s, status, (cn, sn) = authenticate_nonces(port, kind, cluster_id, ip, src)
    assert status == 0
    if kind == 1:
        send_frame(s, LINK_INFO, link_info(cluster_id) if info is None else info)
        t, status, payload = recv_frame(s)
        assert t == LINK_INFO
        if status == 0:
            _listener_ids[(ip, port)] = struct.unpack_from("<Q", payload)[0]
    else:
        listener = _listener_ids.get((ip, port), 0) if listener is None else listener
        send_frame(s, BIND, mac(token, BIND_LABEL, transcript(kind, cluster_id, listener, cn, sn)))
        t, status, payload = recv_frame(s)
        assert t == BIND
    return s, status, payload


def open_link(port, cluster_id=77, caps=CAP_TCP, src=None, table=struct.pack("<I", 0)):
    """Control handshake with a made-up identity and the given table (none: no caches); returns (ctrl
    socket, link token). AssertionError carries the LINK_INFO status when the listener refuses."""
    ctrl, status, payload = handshake(port, 1, cluster_id, info=link_info(cluster_id, caps=caps, table=table),
                                      src=src)
    if status != 0:
        ctrl.close()
    assert status == 0, status
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


def tiny_tables(n, first_id=1):
    """A cache table of ``n`` minimal entries (55 bytes each on the wire: one tensor, no descriptor)."""
    return struct.pack("<I", n) + b"".join(table_entry(first_id + i) for i in range(n))


def flood(port, sockets, seconds, rate, ip="127.0.0.1"):
    """Connect-flood attacker, run in its own process (tests/flood.py): holds up to ``sockets``
    connections to the listener, closing the oldest and opening another, ``rate`` a second, for
    ``seconds``, sending one byte on each (never a HELLO). Returns how many it opened."""
    import collections
    import resource
    import time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, sockets + 256)), hard))
    held = collections.deque()
    opened = 0
    end = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < end:
        ahead = opened / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
        if len(held) >= sockets:
            held.popleft().close()
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect_ex((ip, port))
            s.send(b"K")
        except OSError:
            pass
        held.append(s)
        opened += 1
    for s in held:
        s.close()
    return opened


def pipe(src, dst, transform=None):
    """Copies bytes from ``src`` to ``dst`` until either end closes, then shuts both down: the
    byte-relay half of the relaying test processes. ``transform(data) -> data``, when given, sees
    (and may alter) each read before it is sent, in stream order. Raises nothing."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(transform(data) if transform else data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
