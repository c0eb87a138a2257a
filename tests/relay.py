# SPDX-License-Identifier: Apache-2.0
"""A hostile listener that relays the same-host exchange (README "Security and threat model"), run as
its own process: ``relay.py --target PORT --addr ADDR --bytes N [--token T] [--forward-auth]``.

It accepts links on a port of its own (printed as one JSON line) and opens a connection to the
engine at ``--target`` for each. Without ``--forward-auth`` it authenticates itself on both sides
(with ``--token`` if given) and calls itself cluster 77 towards the target; with it, it passes the
authentication frames through unchanged (it needs no token). Either way it forwards the opener's
LINK_INFO (so the target answers the local exchange with the opener's key), and answers the opener
with the target's identity, local-exchange name and key, but a cache table of its own: one cache, id
``CACHE_ID``, at ``--addr`` (memory of the target that the target never registered). Everything
after that is passed through byte for byte. It runs until its stdin closes.
"""
import argparse
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import threading

from hostile import (AUTH, CHALLENGE, HELLO, HELLO_ACK, LINK_INFO, VERSION, link_info, parse_link_info, recv_frame,
                     send_frame)

CACHE_ID = 4242
CLUSTER = 77
CAP_UCX = 16


def proof(token, label, client_nonce, server_nonce):
    return hmac.new(token.encode(), label + client_nonce + server_nonce, hashlib.sha256).digest()


def entry_at(addr, size, tensors=2, blocks=8):
    """A cache-table entry: ``size`` bytes at ``addr`` as ``tensors`` tensors (a K and a V, so pushes
    of one layer fit) of ``blocks`` blocks, by address descriptor only."""
    each = size // tensors
    body = b"".join(struct.pack("<Q", addr + t * each) for t in range(tensors))
    return (struct.pack("<qBqIQQQQH", CACHE_ID, 1, -1, tensors, each, blocks, 1, each // blocks, 1) +
            struct.pack("<BI", 2, len(body)) + body)


def own_auth(a, b, token):
    """Authenticates as a listener to ``a`` and as cluster CLUSTER to ``b``; the connection kind, or
    None when ``b`` refused us."""
    _, _, hello = recv_frame(a)
    kind, = struct.unpack_from("<I", hello, 4)
    nonce = os.urandom(16)
    has = b"\1\1" if token else b"\0\0"
    send_frame(a, CHALLENGE, nonce + has + (proof(token, b"kvblocks-server", hello[16:32], nonce) if token
                                            else bytes(32)))
    recv_frame(a)  # AUTH: whatever the opener proves, we let it in
    send_frame(a, HELLO_ACK)
    ours = os.urandom(16)
    send_frame(b, HELLO, struct.pack("<IIQ", VERSION, kind, CLUSTER) + ours)
    _, _, ch = recv_frame(b)
    send_frame(b, AUTH, b"\1" + proof(token, b"kvblocks-client", ours, ch[:16]) if token else bytes(33))
    _, status, _ = recv_frame(b)
    return kind if status == 0 else None


def forward_auth(a, b):
    """Passes HELLO .. HELLO_ACK through; the connection kind, or None when ``b`` refused it."""
    _, _, hello = recv_frame(a)
    send_frame(b, HELLO, hello)
    _, _, ch = recv_frame(b)
    send_frame(a, CHALLENGE, ch)
    _, _, auth = recv_frame(a)
    send_frame(b, AUTH, auth)
    _, status, _ = recv_frame(b)
    send_frame(a, HELLO_ACK, status=status)
    return struct.unpack_from("<I", hello, 4)[0] if status == 0 else None


def relay_link_info(a, b, args):
    _, _, mine = recv_frame(a)
    if not args.forward_auth:
        mine = struct.pack("<Q", CLUSTER) + mine[8:]
    send_frame(b, LINK_INFO, mine)
    _, status, payload = recv_frame(b)
    if status != 0:
        send_frame(a, LINK_INFO, status=status)
        return False
    theirs = parse_link_info(payload)
    cid = theirs["cluster_id"] if args.forward_auth else CLUSTER
    send_frame(a, LINK_INFO, link_info(cid, caps=theirs["caps"] & ~CAP_UCX, ident=theirs["identity"],
                                       local_name=theirs["local_name"], local_key=theirs["local_key"],
                                       table=struct.pack("<I", 1) + entry_at(args.addr, args.bytes),
                                       link_token=theirs["token"]))
    return True


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(a, args):
    try:
        b = socket.create_connection(("127.0.0.1", args.target), timeout=10)
        kind = forward_auth(a, b) if args.forward_auth else own_auth(a, b, args.token)
        if kind is None:
            print(json.dumps({"refused_by_target": True}), flush=True)
            a.close()
            b.close()
            return
        if kind == 1 and not relay_link_info(a, b, args):
            return
        a.settimeout(None)
        b.settimeout(None)
        threading.Thread(target=pipe, args=(b, a), daemon=True).start()
        pipe(a, b)
    except (ConnectionError, OSError, AssertionError, struct.error):
        a.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--addr", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--token", default=None)
    ap.add_argument("--forward-auth", action="store_true")
    args = ap.parse_args()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def accept():
        while True:
            a, _ = srv.accept()
            a.settimeout(10)
            threading.Thread(target=serve, args=(a, args), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(json.dumps({"port": srv.getsockname()[1], "pid": os.getpid()}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
