# SPDX-License-Identifier: Apache-2.0
"""A relay that corrupts one bit in flight, run as its own process:
``flip_relay.py --target PORT --marker HEX --direction pull|push``.

It accepts connections on a port of its own (printed as one JSON line, ``{"port": P}``) and opens one
to the engine at ``--target`` for each, passing every byte through both ways (the link handshake
too: without an AuthToken the proofs name no address, so two engines link through it). In one
direction -- ``pull``: from the target to the opener (a READ_RESP's data), ``push``: from the opener
to the target (a WRITE_REQ's data) -- it looks for ``--marker`` (bytes of one block that appear
nowhere else) and flips the lowest bit of the marker's last byte, once, then prints
``{"flipped": N}`` (N: the offset of the flipped byte in that connection's stream). Everything else
passes unchanged. It runs until its stdin closes.
"""
import argparse
import json
import socket
import sys
import threading

from hostile import pipe

STATE = {"done": False}
LOCK = threading.Lock()


def flipper(marker):
    """A hostile.pipe transform flipping one bit of the first ``marker`` in the stream (once per
    process). A marker split across reads is found too: the search spans the last len(marker)-1 bytes
    already sent, and the flipped byte (the marker's last) is always in the read at hand."""
    state = {"tail": b"", "seen": 0}

    def transform(data):
        tail = state["tail"]
        with LOCK:
            if not STATE["done"]:
                hit = (tail + data).find(marker)
                if hit >= 0:
                    at = hit + len(marker) - 1 - len(tail)
                    data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
                    STATE["done"] = True
                    print(json.dumps({"flipped": state["seen"] + at}), flush=True)
        state["tail"] = (tail + data)[-(len(marker) - 1):]
        state["seen"] += len(data)
        return data
    return transform


def serve(listener, target, marker, direction):
    while True:
        a, _ = listener.accept()  # the opener's connection
        b = socket.create_connection(("127.0.0.1", target))
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up = (lambda: pipe(a, b, flipper(marker) if direction == "push" else None))
        down = (lambda: pipe(b, a, flipper(marker) if direction == "pull" else None))
        threading.Thread(target=up, daemon=True).start()
        threading.Thread(target=down, daemon=True).start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--marker", required=True)
    ap.add_argument("--direction", choices=("pull", "push"), required=True)
    args = ap.parse_args()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    threading.Thread(target=serve, args=(listener, args.target, bytes.fromhex(args.marker), args.direction),
                     daemon=True).start()
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
