# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: the decoder links to the prompt and pulls blocks (and a batch row).

    python -m kvblocks.compat pull_blocks_sample.py --role prompt --port P --sync DIR
    python -m kvblocks.compat pull_blocks_sample.py --role decoder --port P --sync DIR
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

PROMPT_CLUSTER_ID = 0
DECODER_CLUSTER_ID = 1
NUM_TENSORS = 4
BLOCK_SHAPE = (8, 16)


def init_llm_datadist(role: LLMRole, cluster_id: int, device_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = device_id
    llm_config.local_comm_res = ""
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def addrs_of(tensors: List[npt.NDArray[np.int32]]) -> List[int]:
    return [int(t.ctypes.data) for t in tensors]


def run_prompt_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID, 0, f"127.0.0.1:{port}")
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(num_tensors=NUM_TENSORS, shape=list(BLOCK_SHAPE), data_type=DataType.DT_INT32,
                           placement=Placement.DEVICE)
    tensors = [pattern(PROMPT_CLUSTER_ID, i, BLOCK_SHAPE) for i in range(NUM_TENSORS)]
    cache_key = BlocksCacheKey(PROMPT_CLUSTER_ID, 0)
    blocks_cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), cache_key)
    assert blocks_cache.cache_id == 1
    rows = [pattern(PROMPT_CLUSTER_ID, 10 + i, BLOCK_SHAPE) for i in range(NUM_TENSORS)]
    batch_cache = cache_manager.register_cache(cache_desc, addrs_of(rows))
    assert batch_cache.cache_id == 2
    logging.info("[prompt] caches registered: %s, %s", blocks_cache, batch_cache)
    signal(sync_dir, "prompt_ready")
    wait_for(sync_dir, "decoder_done")
    cache_manager.unregister_cache(blocks_cache.cache_id)
    cache_manager.unregister_cache(batch_cache.cache_id)
    datadist.finalize()
    logging.info("[prompt] done")


def run_decoder_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID, 0)
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(NUM_TENSORS, list(BLOCK_SHAPE), DataType.DT_INT32)
    tensors = [np.zeros(BLOCK_SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), None)
    rows = [np.zeros(BLOCK_SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    batch_cache = cache_manager.register_cache(cache_desc, addrs_of(rows))
    wait_for(sync_dir, "prompt_ready")

    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    ret, rets = datadist.link_clusters([cluster], 5000)
    if ret != LLMStatusCode.LLM_SUCCESS:
        raise RuntimeError(f"link failed: {ret} {rets}")
    logging.info("[decoder] linked")

    # blocks 1,3,5,7 of the prompt -> blocks 0,2,4,6 here, every tensor
    cache_manager.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 0), cache, [1, 3, 5, 7], [0, 2, 4, 6])
    for i in range(NUM_TENSORS):
        want = np.zeros(BLOCK_SHAPE, dtype=np.int32)
        src = pattern(PROMPT_CLUSTER_ID, i, BLOCK_SHAPE)
        want[[0, 2, 4, 6]] = src[[1, 3, 5, 7]]
        assert_equal(f"tensor {i}", tensors[i], want)

    # keyword form with a half-open layer range and one tensor per layer: layer 2 only
    for t in tensors:
        t[:] = 0
    cache_manager.pull_blocks(src_cache_key=BlocksCacheKey(cluster_id=PROMPT_CLUSTER_ID, model_id=0), dst_cache=cache,
                              src_blocks=[0], dst_blocks=[7], src_layer_range=range(2, 3),
                              dst_layer_range=range(2, 3), tensor_num_per_layer=1)
    for i in range(NUM_TENSORS):
        want = np.zeros(BLOCK_SHAPE, dtype=np.int32)
        if i == 2:
            want[7] = pattern(PROMPT_CLUSTER_ID, 2, BLOCK_SHAPE)[0]
        assert_equal(f"layer pull tensor {i}", tensors[i], want)

    # batch row 3 of the prompt's second cache (peer cache id 2) -> row 5 here
    cache_manager.pull_cache(CacheKeyByIdAndIndex(PROMPT_CLUSTER_ID, 2, 3), batch_cache, 5)
    for i in range(NUM_TENSORS):
        want = np.zeros(BLOCK_SHAPE, dtype=np.int32)
        want[5] = pattern(PROMPT_CLUSTER_ID, 10 + i, BLOCK_SHAPE)[3]
        assert_equal(f"row tensor {i}", rows[i], want)

    ret, rets = datadist.unlink_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, rets
    cache_manager.unregister_cache(cache.cache_id)
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
