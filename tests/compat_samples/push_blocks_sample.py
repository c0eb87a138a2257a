# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: the decoder links; the prompt pushes one layer (tensor_num_per_layer=1) with
reversed blocks, and a batch row to the decoder's cache id 1.

    python -m kvblocks.compat push_blocks_sample.py --role prompt|decoder --port P --sync DIR
"""
import argparse
import logging
from typing import List

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, CacheKeyByIdAndIndex, DataType, LLMClusterInfo, LLMConfig,
                          LLMDataDist, LLMRole, LLMStatusCode, Placement)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 1
DECODER_CLUSTER_ID = 2
NUM_TENSORS = 4
SHAPE = (4, 16)


def init_llm_datadist(role: LLMRole, cluster_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.local_comm_res = ""
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def addrs_of(tensors: List[npt.NDArray[np.int32]]) -> List[int]:
    return [int(t.ctypes.data) for t in tensors]


def run_prompt_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID, f"127.0.0.1:{port}")
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE)
    tensors = [pattern(PROMPT_CLUSTER_ID, i, SHAPE) for i in range(NUM_TENSORS)]
    cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), BlocksCacheKey(PROMPT_CLUSTER_ID, 0))
    rows = [pattern(PROMPT_CLUSTER_ID, 10 + i, SHAPE) for i in range(NUM_TENSORS)]
    batch_cache = cache_manager.register_cache(cache_desc, addrs_of(rows))
    signal(sync_dir, "prompt_ready")
    wait_for(sync_dir, "decoder_linked")

    # layer 3 (= tensor 3 with one tensor per layer): blocks 0,1,2,3 -> 3,2,1,0
    cache_manager.push_blocks(BlocksCacheKey(DECODER_CLUSTER_ID, 0), cache, src_blocks=[0, 1, 2, 3],
                              dst_blocks=[3, 2, 1, 0], src_layer_range=range(3, 4), dst_layer_range=range(3, 4),
                              tensor_num_per_layer=1)
    # layer 0 of two tensors per layer (tensors 0 and 1), block 1 -> block 2 of the decoder's model 7 cache
    cache_manager.push_blocks(BlocksCacheKey(DECODER_CLUSTER_ID, 7), cache, [1], [2], range(0, 1), range(0, 1))
    # batch row 2 -> row 0 of the decoder's first cache (cache ids start at 1 in each process)
    cache_manager.push_cache(CacheKeyByIdAndIndex(DECODER_CLUSTER_ID, 1, 0), batch_cache, 2)
    signal(sync_dir, "pushed")
    wait_for(sync_dir, "decoder_done")
    datadist.finalize()
    logging.info("[prompt] done")


def run_decoder_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID)
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32)
    rows = [np.zeros(SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    batch_cache = cache_manager.register_cache(cache_desc, addrs_of(rows))
    assert batch_cache.cache_id == 1
    tensors = [np.zeros(SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), BlocksCacheKey(DECODER_CLUSTER_ID, 0))
    other = [np.zeros(SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache_manager.register_blocks_cache(cache_desc, addrs_of(other), BlocksCacheKey(DECODER_CLUSTER_ID, 7))
    wait_for(sync_dir, "prompt_ready")

    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    ret, _ = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS
    signal(sync_dir, "decoder_linked")
    wait_for(sync_dir, "pushed")

    zeros = np.zeros(SHAPE, dtype=np.int32)
    for i in range(NUM_TENSORS):
        want = zeros.copy()
        if i == 3:
            src = pattern(PROMPT_CLUSTER_ID, 3, SHAPE)
            want[[3, 2, 1, 0]] = src[[0, 1, 2, 3]]
        assert_equal(f"model 0 tensor {i}", tensors[i], want)
        want = zeros.copy()
        if i in (0, 1):
            want[2] = pattern(PROMPT_CLUSTER_ID, i, SHAPE)[1]
        assert_equal(f"model 7 tensor {i}", other[i], want)
        want = zeros.copy()
        want[0] = pattern(PROMPT_CLUSTER_ID, 10 + i, SHAPE)[2]
        assert_equal(f"row tensor {i}", rows[i], want)
    datadist.unlink_clusters([cluster], 5000)
    datadist.finalize()
    signal(sync_dir, "decoder_done")
    logging.info("[decoder] all data verified")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["prompt", "decoder"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sync", required=True)
    args = parser.parse_args()
    if args.role == "prompt":
        run_prompt_sample(args.port, args.sync)
    else:
        run_decoder_sample(args.port, args.sync)
