# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: the decoder links first; the prompt then allocates a cache with two request keys
and a blocks cache with a BlocksCacheKey. The decoder pulls both by key (kvblocks asks the prompt for
keys its link-time table lacks), checks every byte, and keys the prompt never bound fail with
LLM_KV_CACHE_NOT_EXIST.

    python -m kvblocks.compat late_keys_sample.py --role prompt|decoder --port P --sync DIR
"""
import argparse
import ctypes
import logging
from typing import Callable

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, CacheKey, DataType, LLMClusterInfo, LLMConfig, LLMDataDist,
                          LLMException, LLMRole, LLMStatusCode, Placement)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 1
DECODER_CLUSTER_ID = 2
NUM_TENSORS = 4
SHAPE = (2, 4096)  # INT32: 16 KiB a batch row
BLOCK_SHAPE = (8, 16)
MODEL_ID = 3


def init_llm_datadist(role: LLMRole, cluster_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.enable_cache_manager = True
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def view(addr: int, shape: tuple[int, int]) -> npt.NDArray[np.int32]:
    buf = (ctypes.c_int32 * (shape[0] * shape[1])).from_address(addr)
    return np.frombuffer(memoryview(buf), dtype=np.int32).reshape(shape)


def run_prompt_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID, f"127.0.0.1:{port}")
    cache_manager = datadist.cache_manager
    signal(sync_dir, "prompt_up")
    wait_for(sync_dir, "linked")  # everything below is allocated after the link
    keys = [CacheKey(PROMPT_CLUSTER_ID, req_id=0), CacheKey(PROMPT_CLUSTER_ID, req_id=1)]
    cache = cache_manager.allocate_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE),
                                         keys)
    for i, addr in enumerate(cache.tensor_addrs):
        view(addr, SHAPE)[:] = pattern(PROMPT_CLUSTER_ID, i, SHAPE)
    blocks = cache_manager.allocate_blocks_cache(
        CacheDesc(NUM_TENSORS, list(BLOCK_SHAPE), DataType.DT_INT32, Placement.DEVICE),
        BlocksCacheKey(PROMPT_CLUSTER_ID, MODEL_ID))
    for i, addr in enumerate(blocks.tensor_addrs):
        view(addr, BLOCK_SHAPE)[:] = pattern(PROMPT_CLUSTER_ID, 10 + i, BLOCK_SHAPE)
    signal(sync_dir, "prompt_ready")
    wait_for(sync_dir, "decoder_done")
    for k in keys:
        cache_manager.remove_cache_key(k)  # consumed by the pulls: no-ops
    cache_manager.deallocate_cache(cache)
    cache_manager.deallocate_blocks_cache(blocks)
    datadist.finalize()
    logging.info("[prompt] done")


def expect_not_exist(what: str, call: Callable[[], object]) -> None:
    try:
        call()
    except LLMException as e:
        assert e.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, (what, e.status_code)
        return
    raise AssertionError(f"{what}: pulled")


def run_decoder_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID)
    cache_manager = datadist.cache_manager
    cache = cache_manager.allocate_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE))
    blocks = cache_manager.allocate_blocks_cache(
        CacheDesc(NUM_TENSORS, list(BLOCK_SHAPE), DataType.DT_INT32, Placement.DEVICE))
    wait_for(sync_dir, "prompt_up")
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    ret, _ = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, ret
    signal(sync_dir, "linked")
    wait_for(sync_dir, "prompt_ready")
    cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=1), cache, batch_index=0)
    cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=0), cache, batch_index=1)
    for i, addr in enumerate(cache.tensor_addrs):
        want = pattern(PROMPT_CLUSTER_ID, i, SHAPE)
        assert_equal(f"tensor {i}", view(addr, SHAPE), want[::-1])
    cache_manager.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, MODEL_ID), blocks, [1, 3, 5, 7], [0, 2, 4, 6])
    for i, addr in enumerate(blocks.tensor_addrs):
        want = np.zeros(BLOCK_SHAPE, dtype=np.int32)
        want[[0, 2, 4, 6]] = pattern(PROMPT_CLUSTER_ID, 10 + i, BLOCK_SHAPE)[[1, 3, 5, 7]]
        assert_equal(f"block tensor {i}", view(addr, BLOCK_SHAPE), want)
    expect_not_exist("a consumed key", lambda: cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=1), cache))
    expect_not_exist("an unknown CacheKey",
                     lambda: cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=7), cache))
    expect_not_exist("an unknown BlocksCacheKey",
                     lambda: cache_manager.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, MODEL_ID + 1), blocks,
                                                       [0], [0]))
    datadist.unlink_clusters([cluster], 5000)
    cache_manager.deallocate_cache(cache)
    cache_manager.deallocate_blocks_cache(blocks)
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
