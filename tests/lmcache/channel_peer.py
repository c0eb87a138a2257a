# SPDX-License-Identifier: Apache-2.0
"""A second LMCache server's transfer channel in its own process: a kvblocks channel context over an
arena whose byte at offset ``o`` is ``o % 251`` (so any object's expected bytes are known).

Usage: ``python channel_peer.py ADVERTISE_URL ARENA_BYTES ALIGN [TOKEN [TRANSPORT]]``. Prints one JSON line
``{"ready": true, "pid": ..., "listen": ...}`` once it listens, then serves until stdin closes or says
``quit``; ``{"op": "clients"}`` answers ``{"clients": n}`` (get_num_connected_clients).
"""
import json
import sys

import numpy as np

from kvblocks.lmcache.channel import KvblocksChannelContext
from lmcache.v1.distributed.internal_api import L1MemoryDesc


def main() -> None:
    url, size, align = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    token = sys.argv[4] if len(sys.argv) > 4 else "lmcache-test-token"
    transport = sys.argv[5] if len(sys.argv) > 5 else "auto"
    arena = (np.arange(size, dtype=np.int64) % 251).astype(np.uint8)
    ctx = KvblocksChannelContext(L1MemoryDesc(ptr=arena.ctypes.data, size=size, align_bytes=align), url, url,
                                 auth_token=token, transport=transport, timeout_ms=1000)
    print(json.dumps({"ready": True, "listen": ctx.listen_address}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "clients":
            print(json.dumps({"clients": ctx.get_num_connected_clients()}), flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
