# SPDX-License-Identifier: Apache-2.0
"""A hostile listener that relays the same-host exchange (README "Security and threat model"), run as
its own process: ``relay.py --target PORT [--target-cluster C] --addr ADDR --bytes N [--token T] [--forward-auth]``.

It accepts links on a port of its own (printed as one JSON line) and opens a connection to the
engine at ``--target`` (cluster ``--target-cluster``) for each. Without ``--forward-auth`` it
authenticates itself on both sides (with ``--token`` if given), calls itself cluster 77 towards the
target and writes each data channel's BIND anew for its own connection to the target (it holds the
link token the target gave it); with it, it passes the authentication frames through unchanged (it
needs no token, and the target refuses them: the proof names the relay's address). Either way it forwards the opener's
LINK_INFO (so the target answers the local exchange with the opener's key), and answers the opener
with the target's identity, local-exchange name and key, but a cache table of its own: one cache, id
``CACHE_ID``, at ``--addr`` (memory of the target that the target never registered). Everything
after that is passed through byte for byte. It runs until its stdin closes.
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading

from hostile import (pipe, AUTH, BIND, BIND_LABEL, CHALLENGE, HELLO, HELLO_ACK, LINK_INFO, LISTENER_LABEL, OPENER_LABEL,
                     VERSION, endpoint, link_info, mac, parse_link_info, recv_frame, send_frame, transcript)

CACHE_ID = 4242
CLUSTER = 77
CAP_UCX = 16


LINK_TOKEN = {}  # "token": the link token the target gave us on the control connection


def where(s, peer, token):
    """The listener's address in a transcript: none without a token (docs/protocol.md)."""
    return endpoint(*(s.getpeername() if peer else s.getsockname())[:2]) if token else endpoint()


def entry_at(addr, size, tensors=2, blocks=8):
    """A cache-table entry: ``size`` bytes at ``addr`` as ``tensors`` tensors (a K and a V, so pushes
    of one layer fit) of ``blocks`` blocks, by address descriptor only."""
    each = size // tensors
    body = b"".join(struct.pack("<Q", addr + t * each) for t in range(tensors))
    return (struct.pack("<qBqIQQQQH", CACHE_ID, 1, -1, tensors, each, blocks, 1, each // blocks, 1) +
            struct.pack("<BI", 2, len(body)) + body)


def own_auth(a, b, token, target_cluster):
    """Authenticates as listener CLUSTER to ``a`` and as cluster CLUSTER to ``b``; (the connection kind,
    our transcript with ``b``), or None when ``b`` refused us."""
    _, _, hello = recv_frame(a)
    kind, opener = struct.unpack_from("<IQ", hello, 4)
    nonce = os.urandom(16)
    has = b"\1\1" if token else b"\0\0"
    tr = transcript(kind, opener, CLUSTER, hello[16:32], nonce, where(a, False, token))
    send_frame(a, CHALLENGE, nonce + has + (mac(token.encode(), LISTENER_LABEL, tr) if token else bytes(32)))
    recv_frame(a)  # AUTH: whatever the opener proves, we let it in
    send_frame(a, HELLO_ACK)
    ours = os.urandom(16)
    send_frame(b, HELLO, struct.pack("<IIQ", VERSION, kind, CLUSTER) + ours)
    _, _, ch = recv_frame(b)
    tr = transcript(kind, CLUSTER, target_cluster, ours, ch[:16], where(b, True, token))
    send_frame(b, AUTH, b"\1" + mac(token.encode(), OPENER_LABEL, tr) if token else bytes(33))
    _, status, _ = recv_frame(b)
    return (kind, tr) if status == 0 else None


def rebind(a, b, tr):
    """A data channel: the opener's BIND names its connection to us; the target gets one for ours."""
    recv_frame(a)
    send_frame(b, BIND, mac(LINK_TOKEN["token"], BIND_LABEL, tr))


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
    return (struct.unpack_from("<I", hello, 4)[0], None) if status == 0 else None


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
    LINK_TOKEN["token"] = theirs["token"]
    cid = theirs["cluster_id"] if args.forward_auth else CLUSTER
    send_frame(a, LINK_INFO, link_info(cid, caps=theirs["caps"] & ~CAP_UCX, ident=theirs["identity"],
                                       local_name=theirs["local_name"], local_key=theirs["local_key"],
                                       table=struct.pack("<I", 1) + entry_at(args.addr, args.bytes),
                                       link_token=theirs["token"]))
    return True


def serve(a, args):
    try:
        b = socket.create_connection(("127.0.0.1", args.target), timeout=10)
        got = forward_auth(a, b) if args.forward_auth else own_auth(a, b, args.token, args.target_cluster)
        if got is None:
            print(json.dumps({"refused_by_target": True}), flush=True)
            a.close()
            b.close()
            return
        kind, tr = got
        if kind == 1 and not relay_link_info(a, b, args):
            return
        if kind != 1 and tr is not None:
            rebind(a, b, tr)
        a.settimeout(None)
        b.settimeout(None)
        threading.Thread(target=pipe, args=(b, a), daemon=True).start()
        pipe(a, b)
    except (ConnectionError, OSError, AssertionError, struct.error):
        a.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--target-cluster", type=int, default=2)
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
