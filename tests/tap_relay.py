# SPDX-License-Identifier: Apache-2.0
"""A byte relay that records what it carries, run as its own process (the man in the middle of the
encryption tests): ``tap_relay.py --target PORT --capture FILE [--flip N]``.

It listens on a port of its own (printed as one JSON line, ``{"port": P}``) and relays each
connection to 127.0.0.1:``--target`` byte for byte (hostile.pipe's loop), appending every byte it
carries, both ways, to ``--capture``. With ``--flip N`` it inverts byte N (from 0) of what the target
sends back on each connection: only a connection that carries a large reply (a data channel's pull)
gets that far. It runs until its stdin closes.
"""
import argparse
import json
import socket
import sys
import threading

from hostile import pipe

LOCK = threading.Lock()


def recorder(capture, flip_at):
    """A hostile.pipe transform recording the bytes it sees; flips byte ``flip_at`` (None: none) of
    this direction's stream."""
    state = {"seen": 0}

    def transform(data):
        seen = state["seen"]
        if flip_at is not None and seen <= flip_at < seen + len(data):
            b = bytearray(data)
            b[flip_at - seen] ^= 0xFF
            data = bytes(b)
        state["seen"] = seen + len(data)
        with LOCK:
            capture.write(data)
            capture.flush()
        return data
    return transform


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--capture", required=True)
    ap.add_argument("--flip", type=int, default=None, help="flip this byte of every target->opener stream")
    args = ap.parse_args()
    capture = open(args.capture, "ab")
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(64)
    print(json.dumps({"port": lst.getsockname()[1]}), flush=True)

    def accept():
        while True:
            a, _ = lst.accept()
            b = socket.create_connection(("127.0.0.1", args.target))
            threading.Thread(target=pipe, args=(a, b, recorder(capture, None)), daemon=True).start()
            threading.Thread(target=pipe, args=(b, a, recorder(capture, args.flip)), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
