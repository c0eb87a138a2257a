# SPDX-License-Identifier: Apache-2.0
"""A second process for the key-release tests (spec hixl.md 3.4, L20): a compat LLMDataDist
driven by JSON lines on stdin, one JSON answer line each.

``owner PORT REQ...``: allocates a cache of batch 2 with keys CacheKey(1, REQ) (batch b holds
b + 1 in every element), prints ``{"cache_id": id}``, then answers ``{"op": "deallocate"}``.
``puller PORT``: links to cluster 1 at PORT and answers ``{"op": "released", "key": REQ, "cache_id":
id}`` (waits up to 10 s until the owner's table says the key is unbound) and ``{"op": "pull",
"key": REQ}`` (the status name and the first element pulled).
Both answer ``{"op": "exit"}``."""
import ctypes
import json
import sys
import time

import numpy as np

from kvblocks.llm_datadist import (CacheDesc, CacheKey, DataType, LLMClusterInfo, LLMConfig, LLMDataDist,
                                   LLMException, LLMRole, LLMStatusCode)

SHAPE = [2, 64]


def start(role, cluster, listen):
    cfg = LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    if listen:
        cfg.listen_ip_info = listen
    d = LLMDataDist(role, cluster)
    d.init(cfg.generate_options())
    return d


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def owner(port, reqs):
    d = start(LLMRole.PROMPT, 1, f"127.0.0.1:{port}")
    cm = d.cache_manager
    cache = cm.allocate_cache(CacheDesc(2, SHAPE, DataType.DT_INT32), [CacheKey(1, r) for r in reqs])
    for t in range(2):
        for b in range(2):
            cache_view(cache, t)[b] = b + 1
    answer({"cache_id": cache.cache_id})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "deallocate":
            cm.deallocate_cache(cache)
            answer({"ok": True})
        else:
            break
    d.finalize()


def cache_view(cache, t):
    n = SHAPE[0] * SHAPE[1]
    buf = (ctypes.c_int32 * n).from_address(cache.tensor_addrs[t])
    return np.frombuffer(buf, dtype=np.int32).reshape(SHAPE)


def puller(port):
    d = start(LLMRole.DECODER, 2, "")
    cm = d.cache_manager
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(2)]
    local = cm.register_cache(CacheDesc(2, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in arrays])
    c = LLMClusterInfo()
    c.remote_cluster_id = 1
    c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    ret, _ = d.link_clusters([c])
    answer({"linked": ret == LLMStatusCode.LLM_SUCCESS})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "released":
            key, end = CacheKey(1, cmd["key"])._key(), time.monotonic() + 10
            while key in d._engine._describe_remote_cache(1, cmd["cache_id"])["batch_keys"] and time.monotonic() < end:
                time.sleep(0.01)
            answer({"released": key not in d._engine._describe_remote_cache(1, cmd["cache_id"])["batch_keys"]})
        elif cmd["op"] == "pull":
            arrays[0][:] = 0
            try:
                cm.pull_cache(CacheKey(1, cmd["key"]), local)
                answer({"status": "LLM_SUCCESS", "first": int(arrays[1][0][0])})
            except LLMException as e:
                answer({"status": LLMStatusCode(e.status_code).name})
        else:
            break
    d.finalize()


if __name__ == "__main__":
    if sys.argv[1] == "owner":
        owner(int(sys.argv[2]), [int(r) for r in sys.argv[3:]])
    else:
        puller(int(sys.argv[2]))
