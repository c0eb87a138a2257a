# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: the prompt allocates one cache with two request keys (batch 0 and batch 1); the
decoder pulls key 0 into its batch 0 and key 1 into its batch 1, checks every byte, and a second
pull of a consumed key fails with LLM_KV_CACHE_NOT_EXIST. The prompt's remove_cache_key calls are
then no-ops.

    python -m kvblocks.compat pull_cache_keys_sample.py --role prompt|decoder --port P --sync DIR
"""
import argparse
import ctypes
import logging

import numpy as np
import numpy.typing as npt

from llm_datadist import (CacheDesc, CacheKey, DataType, LLMClusterInfo, LLMConfig, LLMDataDist, LLMException,
                          LLMRole, LLMStatusCode, Placement)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 1
DECODER_CLUSTER_ID = 2
NUM_TENSORS = 4
SHAPE = (2, 4096)  # INT32: 16 KiB a batch row


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
    buf = (ctypes.c_int32 * (SHAPE[0] * SHAPE[1])).from_address(addr)
    return np.frombuffer(memoryview(buf), dtype=np.int32).reshape(SHAPE)


def run_prompt_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID, f"127.0.0.1:{port}")
    cache_manager = datadist.cache_manager
    keys = [CacheKey(PROMPT_CLUSTER_ID, req_id=0), CacheKey(PROMPT_CLUSTER_ID, req_id=1)]
    cache = cache_manager.allocate_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE),
                                         keys)
    for i, addr in enumerate(cache.tensor_addrs):
        view(addr)[:] = pattern(PROMPT_CLUSTER_ID, i, SHAPE)
    signal(sync_dir, "prompt_ready")
    wait_for(sync_dir, "decoder_done")
    for k in keys:
        cache_manager.remove_cache_key(k)  # consumed by the pulls: no-ops
    cache_manager.deallocate_cache(cache)
    datadist.finalize()
    logging.info("[prompt] done")


def run_decoder_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID)
    cache_manager = datadist.cache_manager
    cache = cache_manager.allocate_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE))
    wait_for(sync_dir, "prompt_ready")
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    ret, _ = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, ret
    cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=0), cache, batch_index=0)
    cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=1), cache, batch_index=1)
    for i, addr in enumerate(cache.tensor_addrs):
        assert_equal(f"tensor {i}", view(addr), pattern(PROMPT_CLUSTER_ID, i, SHAPE))
    try:
        cache_manager.pull_cache(CacheKey(PROMPT_CLUSTER_ID, req_id=1), cache, batch_index=0)
        raise AssertionError("a consumed key was pulled again")
    except LLMException as e:
        assert e.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST, e.status_code
    datadist.unlink_clusters([cluster], 5000)
    cache_manager.deallocate_cache(cache)
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
