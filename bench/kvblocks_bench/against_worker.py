# SPDX-License-Identifier: Apache-2.0
"""One build's side of ``kvblocks bench --against``: run as a script, by path, so that ``import
kvblocks`` finds the build named by PYTHONPATH, not the package this file ships in.

    python against_worker.py PATH SCALE     PATH: shm | cma | tcp; SCALE: quick | full

It links to a real second process (this script again, as ``serve``) and times pulls and pushes of
the same blocks, small (16 x 4 KiB) and large (32 x 4 MiB = 128 MiB), through the public API
only: every build since the first wave can run it. It prints one JSON line:
``{"kvblocks": <module file>, "version": ..., "results": {case: [median, p10, p90] seconds}}``, and
exits 1 (printing ``bad`` instead) when a transfer moved wrong bytes.
"""
import json
import os
import random
import socket
import subprocess
import sys
import time

# (tensors, blocks, block bytes, blocks per call)
SHAPES = {"small": (4, 64, 4096, 4), "large": (4, 16, 4 << 20, 8)}
# (warm-up calls, timed calls) per scale and size
REPS = {"quick": {"small": (50, 300), "large": (1, 4)}, "full": {"small": (200, 2000), "large": (2, 12)}}


def _cache(dd, kb, path, size):
    """``(cache, per-tensor uint8 arrays)``, every page touched so no timed call pays a first touch."""
    import numpy as np
    nt, nb, bb, _ = SHAPES[size]
    if path == "cma":  # registered user memory: same-host peers reach it with process_vm_readv/writev
        arrays = [np.zeros((nb, bb), np.uint8) for _ in range(nt)]
        return dd.register_arrays(arrays), arrays
    c = dd.allocate_cache(kb.CacheDesc(nt, kb.DataType.DT_UINT8, [nb, bb]))
    arrays = [c.numpy(i).reshape(nb, bb) for i in range(nt)]
    for a in arrays:
        a.fill(0)
    return c, arrays


def _engine(kb, cluster_id, path, listen=None):
    dd = kb.LlmDataDist(cluster_id, kb.LlmRole.MIX)
    opts = {kb.OPTION_DEVICE_ID: "0", "llm.SyncKvCacheWaitTime": "30000"}
    if listen:
        opts[kb.OPTION_LISTEN_IP_INFO] = listen
    if path == "tcp":
        opts["kvblocks.Transport"] = "tcp"
    dd.initialize(opts)
    return dd


def serve(port, path):
    """The peer: one cache per size, its ids on stdout, then waits for a line on stdin."""
    import kvblocks as kb
    dd = _engine(kb, 1, path, f"127.0.0.1:{port}")
    keep = {s: _cache(dd, kb, path, s) for s in SHAPES}
    for s, (c, arrays) in keep.items():  # a pattern per tensor and block, checked by the pulls
        for t, a in enumerate(arrays):
            a[:, 0] = t
            a[:, 1] = range(len(a))
    print(json.dumps({s: c.cache_id for s, (c, _) in keep.items()}), flush=True)
    sys.stdin.readline()
    dd.finalize()


def _time(fn, blocks, warm, reps):
    for i in range(warm):
        fn(blocks[i % len(blocks)])
    ts = []
    for i in range(reps):
        b = blocks[i % len(blocks)]
        t0 = time.perf_counter()
        fn(b)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return [ts[len(ts) // 2], ts[len(ts) // 10], ts[(9 * len(ts)) // 10]]


def measure(path, scale):
    import kvblocks as kb
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    peer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", str(port), path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ids = json.loads(peer.stdout.readline())
        dd = _engine(kb, 2, path)
        ci = kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", port)])
        rets = dd.link_llm_clusters([ci], 5000)
        if list(rets) != [kb.Status.LLM_SUCCESS]:
            raise RuntimeError(f"link failed: {rets}")
        rng = random.Random(7)
        out, bad = {}, False
        for size, (nt, nb, bb, per_call) in SHAPES.items():
            cache, arrays = _cache(dd, kb, path, size)
            idx = kb.CacheIndex(1, ids[size])
            blocks = [rng.sample(range(nb), per_call) for _ in range(64)]
            warm, reps = REPS[scale][size]
            out[f"{path}/{size}/pull"] = _time(lambda b: dd.pull_kv_blocks(idx, cache, b, b), blocks, warm, reps)
            b = blocks[(reps - 1) % len(blocks)]  # the last timed pull's blocks carry the peer's pattern
            bad |= any(int(arrays[t][k, 0]) != t or int(arrays[t][k, 1]) != k for t in range(nt) for k in b)
            out[f"{path}/{size}/push"] = _time(lambda b: dd.push_kv_blocks(cache, idx, b, b), blocks, warm, reps)
            if path == "cma":
                dd.unregister_kv_cache(cache)
            else:
                dd.deallocate_cache(cache)
        dd.unlink_llm_clusters([ci], 5000)
        dd.finalize()
    finally:
        peer.stdin.write("\n")
        peer.stdin.flush()
        peer.wait(30)
    print(json.dumps({"kvblocks": kb.__file__, "version": getattr(kb, "__version__", "?"),
                      "results": out, "bad": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(measure(sys.argv[1], sys.argv[2]))
