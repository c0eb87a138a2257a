# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample (pull_from_cache_to_blocks): the prompt allocates a contiguous cache with two
request keys; the decoder registers a blocks cache and pulls each key's batch row into its blocks
with pull_blocks(CacheKey, ...): the row is cut into chunks of one local block, chunk j landing in
dst_blocks[j]. Every byte is checked, untouched blocks included.

    python -m kvblocks.compat pull_cache_to_blocks_sample.py --role prompt|decoder --port P --sync DIR
"""
import argparse
import ctypes
import logging
from typing import List

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, CacheKey, DataType, LLMClusterInfo, LLMConfig, LLMDataDist,
                          LLMRole, LLMStatusCode, Placement)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 1
DECODER_CLUSTER_ID = 2
NUM_TENSORS = 4
ROWS = (2, 4096)     # prompt: 2 batch rows of 16 KiB
BLOCKS = (16, 1024)  # decoder: 16 blocks of 4 KiB: a row is 4 blocks
PULLS = {0: [9, 2, 14, 5], 1: [0, 1]}  # key req_id -> dst blocks (key 1: its first two chunks)


def init_llm_datadist(role: LLMRole, cluster_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.enable_cache_manager = True
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def view(addr: int) -> npt.NDArray[np.int32]:
    buf = (ctypes.c_int32 * (ROWS[0] * ROWS[1])).from_address(addr)
    return np.frombuffer(memoryview(buf), dtype=np.int32).reshape(ROWS)


def addrs_of(tensors: List[npt.NDArray[np.int32]]) -> List[int]:
    return [int(t.ctypes.data) for t in tensors]


def run_prompt_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID, f"127.0.0.1:{port}")
    cache_manager = datadist.cache_manager
    keys = [CacheKey(PROMPT_CLUSTER_ID, req_id=r) for r in PULLS]
    cache = cache_manager.allocate_cache(CacheDesc(NUM_TENSORS, list(ROWS), DataType.DT_INT32, Placement.DEVICE),
                                         keys)
    for i, addr in enumerate(cache.tensor_addrs):
        view(addr)[:] = pattern(PROMPT_CLUSTER_ID, i, ROWS)
    signal(sync_dir, "prompt_ready")
    wait_for(sync_dir, "decoder_done")
    for k in keys:
        cache_manager.remove_cache_key(k)
    cache_manager.deallocate_cache(cache)
    datadist.finalize()
    logging.info("[prompt] done")


def run_decoder_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID)
    cache_manager = datadist.cache_manager
    tensors = [np.zeros(BLOCKS, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache = cache_manager.register_blocks_cache(CacheDesc(NUM_TENSORS, list(BLOCKS), DataType.DT_INT32),
                                                addrs_of(tensors), BlocksCacheKey(DECODER_CLUSTER_ID, 0))
    wait_for(sync_dir, "prompt_ready")
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    ret, _ = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, ret
    for req, dst in PULLS.items():
        cache_manager.pull_blocks(CacheKey(PROMPT_CLUSTER_ID, req_id=req), cache, src_blocks=[], dst_blocks=dst)
    for i in range(NUM_TENSORS):
        want = np.zeros(BLOCKS, dtype=np.int32)
        src = pattern(PROMPT_CLUSTER_ID, i, ROWS)
        for req, dst in PULLS.items():
            chunks = src[req].reshape(ROWS[1] // BLOCKS[1], BLOCKS[1])
            want[dst] = chunks[:len(dst)]
        assert_equal(f"tensor {i}", tensors[i], want)
    datadist.unlink_clusters([cluster], 5000)
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
