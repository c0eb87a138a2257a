# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample with ``llm.TransferBackend=hixl`` (cache-manager mode, as CANN's hixl-backend
sample sets it up): the decoder links, pulls blocks, then unlinks naming only the prompt's
``remote_cluster_id``, as the hixl backend allows. The link is gone on both sides afterwards.

    python -m kvblocks.compat hixl_backend_unlink_sample.py --role prompt --ports PP PD --sync DIR
    python -m kvblocks.compat hixl_backend_unlink_sample.py --role decoder --ports PP PD --sync DIR
"""
import argparse
import logging
from typing import List

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig, LLMDataDist, LLMException,
                          LLMRole, LLMStatusCode)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 0
DECODER_CLUSTER_ID = 1
NUM_TENSORS = 2
BLOCK_SHAPE = (8, 32)


def init_llm_datadist(role: LLMRole, cluster_id: int, port: int) -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.enable_cache_manager = True
    llm_config.enable_remote_cache_accessible = True
    llm_config.transfer_backend = "hixl"
    llm_config.listen_ip_info = f"127.0.0.1:{port}"
    options = llm_config.generate_options()
    assert options["llm.TransferBackend"] == "hixl", options
    datadist.init(options)
    return datadist


def addrs_of(tensors: List[npt.NDArray[np.int32]]) -> List[int]:
    return [int(t.ctypes.data) for t in tensors]


def expect_code(what: str, code: LLMStatusCode, exc: LLMException) -> None:
    if exc.status_code != code:
        raise AssertionError(f"{what}: {exc.status_code}, expected {code}")


def run_prompt(ports: List[int], sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.PROMPT, PROMPT_CLUSTER_ID, ports[0])
    cm = datadist.cache_manager
    tensors = [pattern(PROMPT_CLUSTER_ID, i, BLOCK_SHAPE) for i in range(NUM_TENSORS)]
    cache = cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(BLOCK_SHAPE), DataType.DT_INT32),
                                     addrs_of(tensors), BlocksCacheKey(PROMPT_CLUSTER_ID, 0))
    signal(sync_dir, "prompt_ready")
    wait_for(sync_dir, "decoder_unlinked")
    # The decoder's unlink told this side: pushing to it now finds no link.
    try:
        cm.push_blocks(BlocksCacheKey(DECODER_CLUSTER_ID, 0), cache, [0], [0])
        raise AssertionError("push_blocks after the peer unlinked did not raise")
    except LLMException as e:
        expect_code("prompt push after unlink", LLMStatusCode.LLM_NOT_YET_LINK, e)
    signal(sync_dir, "prompt_checked")
    cm.unregister_cache(cache.cache_id)
    datadist.finalize()
    logging.info("[prompt] link gone on this side too")


def run_decoder(ports: List[int], sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, DECODER_CLUSTER_ID, ports[1])
    cm = datadist.cache_manager
    tensors = [np.zeros(BLOCK_SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache = cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(BLOCK_SHAPE), DataType.DT_INT32),
                                     addrs_of(tensors), BlocksCacheKey(DECODER_CLUSTER_ID, 0))
    wait_for(sync_dir, "prompt_ready")

    cluster = LLMClusterInfo()
    cluster.remote_cluster_id = PROMPT_CLUSTER_ID
    cluster.append_local_ip_info("127.0.0.1", 0)
    cluster.append_remote_ip_info("127.0.0.1", ports[0])
    ret, rets = datadist.link_clusters([cluster], 5000)
    if ret != LLMStatusCode.LLM_SUCCESS:
        raise RuntimeError(f"link failed: {ret} {rets}")

    cm.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 0), cache, [2, 5], [0, 1])
    for i in range(NUM_TENSORS):
        want = np.zeros(BLOCK_SHAPE, dtype=np.int32)
        want[[0, 1]] = pattern(PROMPT_CLUSTER_ID, i, BLOCK_SHAPE)[[2, 5]]
        assert_equal(f"tensor {i}", tensors[i], want)

    # hixl backend: the cluster id alone names the link (no ip infos), and the unlink is not forced.
    by_id = LLMClusterInfo()
    by_id.remote_cluster_id = PROMPT_CLUSTER_ID
    ret, rets = datadist.unlink_clusters([by_id], 5000)
    if ret != LLMStatusCode.LLM_SUCCESS or rets != [LLMStatusCode.LLM_SUCCESS]:
        raise AssertionError(f"unlink by remote_cluster_id: {ret} {rets}")
    try:
        cm.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 0), cache, [0], [0])
        raise AssertionError("pull_blocks after unlink did not raise")
    except LLMException as e:
        expect_code("decoder pull after unlink", LLMStatusCode.LLM_NOT_YET_LINK, e)
    signal(sync_dir, "decoder_unlinked")
    wait_for(sync_dir, "prompt_checked")
    cm.unregister_cache(cache.cache_id)
    datadist.finalize()
    logging.info("[decoder] all data verified, unlinked by cluster id")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["prompt", "decoder"], required=True)
    parser.add_argument("--ports", type=int, nargs=2, required=True)
    parser.add_argument("--sync", required=True)
    args = parser.parse_args()
    if args.role == "prompt":
        run_prompt(args.ports, args.sync)
    else:
        run_decoder(args.ports, args.sync)
