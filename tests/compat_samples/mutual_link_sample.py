# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: two MIX peers each listen and link to the other; then A pulls from B while
B pushes to A, at the same time, on disjoint blocks.

    python -m kvblocks.compat mutual_link_sample.py --side a|b --ports PA PB --sync DIR
"""
import argparse
import logging
from typing import List

from llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig, LLMDataDist, LLMRole,
                          LLMStatusCode)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

IDS = {"a": 11, "b": 22}
NUM_TENSORS = 4
SHAPE = (16, 8)
ROUNDS = 20


def run(side: str, ports: List[int], sync_dir: str) -> None:
    me, peer = side, "b" if side == "a" else "a"
    my_id, peer_id = IDS[me], IDS[peer]
    my_port, peer_port = (ports[0], ports[1]) if side == "a" else (ports[1], ports[0])
    datadist = LLMDataDist(LLMRole.MIX, my_id)
    config = LLMConfig()
    config.device_id = 0
    config.local_comm_res = ""
    config.listen_ip_info = f"127.0.0.1:{my_port}"
    datadist.init(config.generate_options())
    cm = datadist.cache_manager
    tensors = [pattern(my_id, i, SHAPE).copy() for i in range(NUM_TENSORS)]
    cache = cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32),
                                     [int(t.ctypes.data) for t in tensors], BlocksCacheKey(my_id, 0))
    signal(sync_dir, f"{me}_ready")
    wait_for(sync_dir, f"{peer}_ready")

    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = peer_id
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", peer_port)
    ret, rets = datadist.link_clusters([cluster], 5000)
    # The peer may have linked first: one link serves both directions.
    assert ret in (LLMStatusCode.LLM_SUCCESS, LLMStatusCode.LLM_ALREADY_LINK), rets
    logging.info("[%s] link_clusters -> %s", me, ret)
    signal(sync_dir, f"{me}_linked")
    wait_for(sync_dir, f"{peer}_linked")

    for _ in range(ROUNDS):
        if side == "a":  # A pulls B's blocks 0..3 into its blocks 8..11
            cm.pull_blocks(BlocksCacheKey(peer_id, 0), cache, [0, 1, 2, 3], [8, 9, 10, 11])
        else:  # B pushes its blocks 4..7 into A's blocks 12..15, at the same time
            cm.push_blocks(BlocksCacheKey(peer_id, 0), cache, [4, 5, 6, 7], [12, 13, 14, 15])
    signal(sync_dir, f"{me}_moved")
    wait_for(sync_dir, f"{peer}_moved")
    if side == "a":
        for i, t in enumerate(tensors):
            want = pattern(my_id, i, SHAPE).copy()
            want[8:12] = pattern(peer_id, i, SHAPE)[0:4]
            want[12:16] = pattern(peer_id, i, SHAPE)[4:8]
            assert_equal(f"tensor {i}", t, want)
    else:
        for i, t in enumerate(tensors):
            assert_equal(f"tensor {i}", t, pattern(my_id, i, SHAPE))
    signal(sync_dir, f"{me}_verified")
    wait_for(sync_dir, f"{peer}_verified")
    datadist.unlink_clusters([cluster], 5000, force=True)
    datadist.finalize()
    logging.info("[%s] all data verified", me)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["a", "b"], required=True)
    parser.add_argument("--ports", type=int, nargs=2, required=True)
    parser.add_argument("--sync", required=True)
    args = parser.parse_args()
    run(args.side, list(args.ports), args.sync)
