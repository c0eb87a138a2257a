# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: the prompt computes its KV cache layer by layer and transfer_cache_async pushes
each layer to the decoder once the layer synchronizer says it is ready (remote-cache-accessible
mode, blocks to blocks). The decoder checks every byte.

    python -m kvblocks.compat transfer_cache_async_sample.py --role prompt|decoder --port P --sync DIR
"""
import argparse
import logging
import threading
from typing import List, Optional

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LayerSynchronizer, LLMClusterInfo, LLMConfig,
                          LLMDataDist, LLMRole, LLMStatusCode, Placement, TransferWithCacheKeyConfig)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 0
DECODER_CLUSTER_ID = 1
NUM_TENSORS = 4  # 2 layers of K and V
SHAPE = (4, 256)
SRC_BLOCKS, DST_BLOCKS = [0, 1, 2], [2, 1, 0]


def init_llm_datadist(role: LLMRole, cluster_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.enable_cache_manager = True
    llm_config.enable_remote_cache_accessible = True
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def addrs_of(tensors: List[npt.NDArray[np.int32]]) -> List[int]:
    return [int(t.ctypes.data) for t in tensors]


class ComputeThenSync(LayerSynchronizer):
    """Stands in for the model: "computes" layer l (writes its K and V) and then reports it ready."""

    def __init__(self, tensors: List[npt.NDArray[np.int32]]) -> None:
        self.tensors = tensors
        self.calls: List[int] = []
        self.thread: Optional[int] = None

    def synchronize_layer(self, layer_index: int, timeout_in_millis: Optional[int]) -> bool:
        self.calls.append(layer_index)
        self.thread = threading.get_ident()
        for t in (2 * layer_index, 2 * layer_index + 1):
            self.tensors[t][:] = pattern(PROMPT_CLUSTER_ID + 1, t, SHAPE)
        return True


def run_prompt_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID)
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE)
    tensors = [np.zeros(SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), BlocksCacheKey(PROMPT_CLUSTER_ID, 0))
    wait_for(sync_dir, "decoder_ready")
    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = DECODER_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", port)
    ret, _ = datadist.link_clusters([cluster], 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, ret

    sync = ComputeThenSync(tensors)
    config = TransferWithCacheKeyConfig(BlocksCacheKey(DECODER_CLUSTER_ID, 0), range(0, 2), range(0, 2))
    task = cache_manager.transfer_cache_async(cache, sync, [config], src_block_indices=SRC_BLOCKS,
                                              dst_block_indices=DST_BLOCKS)
    results = task.get_results()
    assert results == [LLMStatusCode.LLM_SUCCESS], results
    assert task.synchronize() == LLMStatusCode.LLM_SUCCESS
    assert sync.calls == [0, 1] and sync.thread != threading.get_ident(), (sync.calls, sync.thread)
    signal(sync_dir, "pushed")
    wait_for(sync_dir, "decoder_done")
    datadist.unlink_clusters([cluster], 5000, force=True)
    cache_manager.unregister_cache(cache.cache_id)
    datadist.finalize()
    logging.info("[prompt] done")


def run_decoder_sample(port: int, sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID, f"127.0.0.1:{port}")
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32, Placement.DEVICE)
    tensors = [np.zeros(SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), BlocksCacheKey(DECODER_CLUSTER_ID, 0))
    signal(sync_dir, "decoder_ready")
    wait_for(sync_dir, "pushed")
    for t in range(NUM_TENSORS):
        want = np.zeros(SHAPE, dtype=np.int32)
        want[DST_BLOCKS] = pattern(PROMPT_CLUSTER_ID + 1, t, SHAPE)[SRC_BLOCKS]
        assert_equal(f"tensor {t}", tensors[t], want)
    signal(sync_dir, "decoder_done")
    cache_manager.unregister_cache(cache.cache_id)
    datadist.finalize()
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
