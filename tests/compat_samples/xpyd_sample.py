# SPDX-License-Identifier: Apache-2.0
"""CANN-style xPyD sample: one decoder links to two prompts in one call and pulls from each.
Cluster ids are packed from the IPv4 address and the port, as serving frameworks do.

    python -m kvblocks.compat xpyd_sample.py --role prompt --index 0|1 --ports P0 P1 --sync DIR
    python -m kvblocks.compat xpyd_sample.py --role decoder --index 0 --ports P0 P1 --sync DIR
"""
import argparse
import logging
import socket
from typing import List

import numpy as np

from llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig, LLMDataDist, LLMRole,
                          LLMStatusCode)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

HOST = "127.0.0.1"
NUM_TENSORS = 4
SHAPE = (4, 32)


def pack_cluster_id(ip: str, port: int) -> int:
    return (int.from_bytes(socket.inet_aton(ip), "big") << 16) | port


def init_llm_datadist(role: LLMRole, cluster_id: int, listen: str = "") -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = 0
    llm_config.local_comm_res = ""
    if listen:
        llm_config.listen_ip_info = listen
    datadist.init(llm_config.generate_options())
    return datadist


def run_prompt_sample(index: int, ports: List[int], sync_dir: str) -> None:
    cluster_id = pack_cluster_id(HOST, ports[index])
    datadist = init_llm_datadist(LLMRole.PROMPT, cluster_id, f"{HOST}:{ports[index]}")
    cm = datadist.cache_manager
    tensors = [pattern(index + 1, i, SHAPE) for i in range(NUM_TENSORS)]
    cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32),
                             [int(t.ctypes.data) for t in tensors], BlocksCacheKey(cluster_id, 0))
    signal(sync_dir, f"prompt{index}_ready")
    wait_for(sync_dir, "decoder_done")
    datadist.finalize()
    logging.info("[prompt %d] done", index)


def run_decoder_sample(ports: List[int], sync_dir: str) -> None:
    datadist = init_llm_datadist(LLMRole.DECODER, pack_cluster_id(HOST, 1))
    cm = datadist.cache_manager
    tensors = [np.zeros(SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
    cache = cm.register_blocks_cache(CacheDesc(NUM_TENSORS, list(SHAPE), DataType.DT_INT32),
                                     [int(t.ctypes.data) for t in tensors])
    clusters = []
    for index, port in enumerate(ports):
        wait_for(sync_dir, f"prompt{index}_ready")
        cluster = LLMClusterInfo()
        cluster.remote_cluster_id = pack_cluster_id(HOST, port)
        cluster.append_local_ip_info(HOST, 0)
        cluster.append_remote_ip_info(HOST, port)
        clusters.append(cluster)
    ret, rets = datadist.link_clusters(clusters, 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS and rets == [LLMStatusCode.LLM_SUCCESS] * 2, rets

    cm.pull_blocks(BlocksCacheKey(pack_cluster_id(HOST, ports[0]), 0), cache, [0, 1], [0, 1])
    cm.pull_blocks(BlocksCacheKey(pack_cluster_id(HOST, ports[1]), 0), cache, [0, 3], [2, 3])
    for i in range(NUM_TENSORS):
        want = np.zeros(SHAPE, dtype=np.int32)
        want[[0, 1]] = pattern(1, i, SHAPE)[[0, 1]]
        want[[2, 3]] = pattern(2, i, SHAPE)[[0, 3]]
        assert_equal(f"tensor {i}", tensors[i], want)
    ret, rets = datadist.unlink_clusters(clusters, 5000)
    assert ret == LLMStatusCode.LLM_SUCCESS, rets
    datadist.finalize()
    signal(sync_dir, "decoder_done")
    logging.info("[decoder] all data verified")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["prompt", "decoder"], required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--ports", type=int, nargs=2, required=True)
    parser.add_argument("--sync", required=True)
    args = parser.parse_args()
    if args.role == "prompt":
        run_prompt_sample(args.index, list(args.ports), args.sync)
    else:
        run_decoder_sample(list(args.ports), args.sync)
