# SPDX-License-Identifier: Apache-2.0
"""A real second kvblocks process for cross-process tests, driven by JSON lines on stdin.

Run as ``python tests/peer.py --cluster 1 --listen 127.0.0.1:PORT``. It allocates one cache
("alloc", shared memory) and registers one made of numpy arrays ("reg"), fills both with a
pattern that encodes (cluster, tensor, block), prints ``{"ready": ..., "alloc": id, "reg": id}``
and then answers commands such as ``{"op": "link", ...}``, ``{"op": "pull", ...}``,
``{"op": "digest"}``, ``{"op": "alloc", "name": ..., "seed": ...}`` (another cache, after the
link say; optionally with a cache ``key`` and batch ``keys``), ``{"op": "find_key", ...}``,
``{"op": "unbind", ...}``, ``{"op": "heap", "size": n}`` (a buffer it never registers),
``{"op": "secret", "hex": ...}`` (another, holding ``hex``), ``{"op": "path", "cluster": id}``,
``{"op": "metrics"}``, ``{"op": "serve_metrics"}`` and ``{"op": "exit"}`` one line each.
"""
import argparse
import ctypes
import hashlib
import json
import os
import sys
import time

import numpy as np

import kvblocks as kb


def pattern(cluster: int, tensor: int, num_blocks: int, block_bytes: int) -> np.ndarray:
    """Every 8-byte word of block b of tensor t of `cluster` holds cluster<<48 | t<<24 | b."""
    words = block_bytes // 8
    col = (np.uint64(cluster) << np.uint64(48)) | (np.uint64(tensor) << np.uint64(24))
    blocks = np.arange(num_blocks, dtype=np.uint64) | col
    return np.repeat(blocks, words).reshape(num_blocks, words).view(np.uint8).reshape(num_blocks, block_bytes)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", type=int, required=True)
    ap.add_argument("--listen", default="")
    ap.add_argument("--role", default="MIX")
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--block-bytes", type=int, default=64)
    ap.add_argument("--wait-ms", type=int, default=1000)
    ap.add_argument("--auth", default=None)
    ap.add_argument("--option", action="append", default=[], help="KEY=VALUE: another engine option")
    args = ap.parse_args()

    dd = kb.LlmDataDist(args.cluster, kb.LlmRole[args.role])
    opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: args.transport,
            kb.OPTION_SYNC_CACHE_WAIT_TIME: str(args.wait_ms)}
    if args.listen:
        opts[kb.OPTION_LISTEN_IP_INFO] = args.listen
    if args.auth is not None:
        opts[kb.OPTION_AUTH_TOKEN] = args.auth
    for kv in args.option:
        k, _, v = kv.partition("=")
        opts[k] = v
    dd.initialize(opts)
    desc = kb.CacheDesc(args.tensors, kb.DataType.DT_UINT8, [args.blocks, args.block_bytes])
    alloc = dd.allocate_cache(desc)
    arrays = [pattern(args.cluster, t, args.blocks, args.block_bytes) for t in range(args.tensors)]
    for t in range(args.tensors):
        alloc.numpy(t)[:] = arrays[t]
    reg = dd.register_arrays(arrays)
    caches = {"alloc": alloc, "reg": reg}
    out = sys.stdout
    heap = None
    secrets = []

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reply({"ready": True, "alloc": alloc.cache_id, "reg": reg.cache_id, "pid": os.getpid(),
           "addrs": {k: list(c.tensor_addrs) for k, c in caches.items()},
           "tensor_bytes": args.blocks * args.block_bytes, "listen": dd.listen_address})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "exit":
                break
            if op == "digest":
                reply({"digest": {k: [hashlib.sha256(c.tensor(t)).hexdigest() for t in range(args.tensors)]
                                  for k, c in caches.items()}})
            elif op == "link":
                rets = dd.link_llm_clusters([kb.ClusterInfo(cmd["cluster"], 0, [kb.IpInfo(cmd["ip"], 0)],
                                                            [kb.IpInfo(cmd["ip"], cmd["port"])])], 5000)
                why = dd.link_failure(cmd["cluster"])
                res = {"rets": [int(r) for r in rets], "path": dd.link_path(cmd["cluster"])}
                if why is not None:
                    res["why"] = [why.reason, int(why.status), why.message]
                reply(res)
            elif op == "unlink":
                rets = dd.unlink_llm_clusters([kb.ClusterInfo(cmd["cluster"], 0, [kb.IpInfo(cmd["ip"], 0)],
                                                              [kb.IpInfo(cmd["ip"], cmd["port"])])], 5000)
                reply({"rets": [int(r) for r in rets]})
            elif op in ("pull", "push"):
                idx = kb.CacheIndex(cmd["cluster"], cmd["remote_cache"])
                local = caches[cmd["local"]]
                if op == "pull":
                    dd.pull_kv_blocks(idx, local, cmd["src"], cmd["dst"])
                else:
                    dd.push_kv_blocks(local, idx, cmd["src"], cmd["dst"])
                reply({"ok": True})
            elif op == "alloc":  # another cache (after the link, say), filled with `seed`'s pattern
                # optional: "key" tags the cache, "keys" binds a key to each batch index
                c = dd._add_cache(desc, None, 0, cmd.get("key", -1), None) if "key" in cmd else dd.allocate_cache(desc)
                if cmd.get("keys"):
                    dd._set_batch_keys(c, cmd["keys"])
                rng = np.random.default_rng(cmd["seed"]) if cmd.get("random") else None  # distinct bytes
                for t in range(args.tensors):
                    c.numpy(t)[:] = pattern(cmd["seed"], t, args.blocks, args.block_bytes) if rng is None else \
                        rng.integers(0, 256, (args.blocks, args.block_bytes), dtype=np.uint8)
                caches[cmd["name"]] = c
                reply({"cache": c.cache_id})
            elif op == "find_key":  # a peer cache by batch key (CacheKey) or cache key (BlocksCacheKey)
                if cmd.get("batch", True):
                    cid, bi = dd._find_remote_key(cmd["cluster"], cmd["key"])
                    reply({"cache": cid, "batch": bi})
                else:
                    reply({"cache": dd._find_remote_cache(cmd["cluster"], cmd["key"])})
            elif op == "unbind":  # True when the key was still bound
                reply({"was": dd._unbind_key(caches[cmd["cache"]], cmd["key"])})
            elif op == "unregister":
                dd.unregister_kv_cache(caches.pop(cmd["cache"]))
                reply({"ok": True})
            elif op == "fill":  # back to this peer's own pattern
                for t in range(args.tensors):
                    caches[cmd["which"]].numpy(t)[:] = pattern(args.cluster, t, args.blocks, args.block_bytes)
                reply({"ok": True})
            elif op == "fork_child":  # a child that keeps every fd (the link's sockets too), then exits
                child = os.fork()
                if child == 0:
                    time.sleep(cmd["seconds"])
                    os._exit(0)
                reply({"child": child})
            elif op == "secret":  # memory kvblocks never registered, holding `hex`: its address
                secrets.append(ctypes.create_string_buffer(bytes.fromhex(cmd["hex"])))
                reply({"addr": ctypes.addressof(secrets[-1])})
            elif op == "read":
                reply({"hex": bytes(caches[cmd["cache"]].tensor(cmd["tensor"])).hex()})
            elif op == "heap":  # a buffer this process never registered: its address and bytes now
                if heap is None:
                    heap = np.frombuffer(b"UNREGISTERED-HEAP-" * (cmd["size"] // 18 + 1), np.uint8)[:cmd["size"]].copy()
                reply({"addr": heap.ctypes.data, "hex": heap.tobytes().hex()})
            elif op == "path":
                reply({"path": dd.link_path(cmd["cluster"])})
            elif op == "metrics":  # this engine's snapshot (README "Metrics")
                reply({"metrics": dd.metrics()})
            elif op == "serve_metrics":  # kvblocks.serve_metrics on a free port: its port
                reply({"port": kb.serve_metrics(0).server_port})
            else:
                reply({"error": f"unknown op {op}"})
        except kb.LLMException as e:
            reply({"status": int(e.status_code), "error": str(e)})
    dd.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
