# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: the decoder pulls from the prompt; both unlink and switch roles; then the
old prompt (now decoder) links to the old decoder (now prompt, listening), pulls and pushes.

    python -m kvblocks.compat switch_role_sample.py --role prompt|decoder --port P1 --port2 P2 --sync DIR
"""
import argparse
import logging
from typing import List

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig, LLMDataDist,
                          LLMRole, LLMStatusCode)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

P_ID = 1
D_ID = 2
NUM_TENSORS = 2
SHAPE = (8, 16)


def init_llm_datadist(role: LLMRole, cluster_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.local_comm_res = ""
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def cluster_info(remote_id: int, port: int) -> LLMClusterInfo:
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = remote_id
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    return cluster


def expect(tensors: List[npt.NDArray[np.int32]], me: int, peer: int,
           copied: "dict[int, tuple[int, int]]") -> None:
    """copied: dst block -> (owner, src block); every other block holds the owner's pattern."""
    for i, t in enumerate(tensors):
        want = pattern(me, i, SHAPE).copy()
        for dst, (owner, src) in copied.items():
            want[dst] = pattern(owner, i, SHAPE)[src]
        assert_equal(f"cluster {me} tensor {i}", t, want)


def run_prompt_sample(port: int, port2: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, P_ID, f"127.0.0.1:{port}")
    cm = datadist.cache_manager
    tensors = [pattern(P_ID, i, SHAPE).copy() for i in range(NUM_TENSORS)]
    cache = cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32),
                                     [int(t.ctypes.data) for t in tensors], BlocksCacheKey(P_ID, 0))
    signal(sync_dir, "p_ready")
    wait_for(sync_dir, "d_phase1_done")

    # now the decoder: stop listening
    datadist.switch_role(LLMRole.DECODER)
    signal(sync_dir, "p_switched")
    wait_for(sync_dir, "d_listening")
    cluster = cluster_info(D_ID, port2)
    ret, rets = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, rets
    cm.pull_blocks(BlocksCacheKey(D_ID, 0), cache, [4, 5], [4, 5])
    expect(tensors, P_ID, D_ID, {4: (D_ID, 4), 5: (D_ID, 5)})
    cm.push_blocks(BlocksCacheKey(D_ID, 0), cache, [6], [7], tensor_num_per_layer=1)
    signal(sync_dir, "p_done")
    wait_for(sync_dir, "d_done")
    datadist.unlink_clusters([cluster], 5000)
    datadist.finalize()
    logging.info("[old prompt] all data verified")


def run_decoder_sample(port: int, port2: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, D_ID)
    cm = datadist.cache_manager
    tensors = [pattern(D_ID, i, SHAPE).copy() for i in range(NUM_TENSORS)]
    cache = cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32),
                                     [int(t.ctypes.data) for t in tensors], BlocksCacheKey(D_ID, 0))
    wait_for(sync_dir, "p_ready")
    cluster = cluster_info(P_ID, port)
    ret, rets = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, rets
    cm.pull_blocks(BlocksCacheKey(P_ID, 0), cache, [0, 1], [2, 3])
    expect(tensors, D_ID, P_ID, {2: (P_ID, 0), 3: (P_ID, 1)})
    ret, rets = datadist.unlink_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, rets
    signal(sync_dir, "d_phase1_done")

    wait_for(sync_dir, "p_switched")
    datadist.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{port2}"})
    signal(sync_dir, "d_listening")
    wait_for(sync_dir, "p_done")
    expect(tensors, D_ID, P_ID, {2: (P_ID, 0), 3: (P_ID, 1), 7: (P_ID, 6)})
    signal(sync_dir, "d_done")
    datadist.finalize()
    logging.info("[old decoder] all data verified")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["prompt", "decoder"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--port2", type=int, required=True)
    parser.add_argument("--sync", required=True)
    args = parser.parse_args()
    if args.role == "prompt":
        run_prompt_sample(args.port, args.port2, args.sync)
    else:
        run_decoder_sample(args.port, args.port2, args.sync)
