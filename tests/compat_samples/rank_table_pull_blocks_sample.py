# SPDX-License-Identifier: Apache-2.0
"""CANN-style sample: prompt and decoder link with a rank table (``LLMDataDist.link``), wait for
``query_register_mem_status`` to report OK, the decoder pulls blocks, then both ``unlink``.

Each process builds the same rank table: one server per process, each with one device whose
``device_ip`` is 127.0.0.1 and whose ``device_port`` (kvblocks extension) is that process's
listen port.

    python -m kvblocks.compat rank_table_pull_blocks_sample.py --role prompt --ports PP PD --sync DIR
    python -m kvblocks.compat rank_table_pull_blocks_sample.py --role decoder --ports PP PD --sync DIR
"""
import argparse
import json
import logging
import time
from typing import List

import numpy as np
import numpy.typing as npt

from llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMConfig, LLMDataDist, LLMException, LLMRole,
                          LLMStatusCode, Placement, RegisterMemStatus)
from sample_utils import assert_equal, pattern, signal, wait_for

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)

PROMPT_CLUSTER_ID = 0
DECODER_CLUSTER_ID = 1
CLUSTER_RANK_INFO = {PROMPT_CLUSTER_ID: 0, DECODER_CLUSTER_ID: 1}
NUM_TENSORS = 4
BLOCK_SHAPE = (8, 16)
LINK_WAIT_S = 10.0


def build_rank_table(ports: List[int]) -> str:
    servers = []
    for rank, port in enumerate(ports):
        servers.append({"server_id": f"server{rank}",
                        "device": [{"device_id": str(rank), "device_ip": "127.0.0.1", "rank_id": str(rank),
                                    "device_port": port}]})
    return json.dumps({"server_count": str(len(servers)), "server_list": servers, "status": "completed",
                       "version": "1.2"})


def init_llm_datadist(role: LLMRole, cluster_id: int, device_id: int, port: int) -> LLMDataDist:
    datadist = LLMDataDist(role, cluster_id)
    llm_config = LLMConfig()
    llm_config.device_id = device_id
    llm_config.local_comm_res = ""
    llm_config.listen_ip_info = f"127.0.0.1:{port}"
    datadist.init(llm_config.generate_options())
    return datadist


def wait_linked(datadist: LLMDataDist, comm_id: int) -> None:
    deadline = time.monotonic() + LINK_WAIT_S
    while True:
        status = datadist.query_register_mem_status(comm_id)
        if status == RegisterMemStatus.OK:
            return
        if status == RegisterMemStatus.FAILED:
            raise RuntimeError(f"comm {comm_id}: linking failed")
        if time.monotonic() > deadline:
            raise TimeoutError(f"comm {comm_id}: still {status} after {LINK_WAIT_S} s")
        time.sleep(0.01)


def addrs_of(tensors: List[npt.NDArray[np.int32]]) -> List[int]:
    return [int(t.ctypes.data) for t in tensors]


def run(role: str, ports: List[int], sync_dir: str) -> None:
    is_prompt = role == "prompt"
    cluster_id = PROMPT_CLUSTER_ID if is_prompt else DECODER_CLUSTER_ID
    rank = CLUSTER_RANK_INFO[cluster_id]
    datadist = init_llm_datadist(LLMRole.PROMPT if is_prompt else LLMRole.DECODER, cluster_id, rank, ports[rank])
    cache_manager = datadist.cache_manager
    cache_desc = CacheDesc(num_tensors=NUM_TENSORS, shape=list(BLOCK_SHAPE), data_type=DataType.DT_INT32,
                           placement=Placement.DEVICE)
    if is_prompt:
        tensors = [pattern(PROMPT_CLUSTER_ID, i, BLOCK_SHAPE) for i in range(NUM_TENSORS)]
        cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), BlocksCacheKey(PROMPT_CLUSTER_ID, 0))
    else:
        tensors = [np.zeros(BLOCK_SHAPE, dtype=np.int32) for _ in range(NUM_TENSORS)]
        cache = cache_manager.register_blocks_cache(cache_desc, addrs_of(tensors), None)
    # kvblocks reads a peer's caches when the link is made: register them first.
    signal(sync_dir, f"{role}_registered")
    wait_for(sync_dir, "decoder_registered" if is_prompt else "prompt_registered")

    comm_id = datadist.link("pd_comm", CLUSTER_RANK_INFO, build_rank_table(ports))
    assert isinstance(comm_id, int) and comm_id > 0, comm_id
    wait_linked(datadist, comm_id)
    logging.info("[%s] linked, comm id %d", role, comm_id)
    signal(sync_dir, f"{role}_linked")
    wait_for(sync_dir, "decoder_linked" if is_prompt else "prompt_linked")

    if is_prompt:
        wait_for(sync_dir, "decoder_unlinked")
        datadist.unlink(comm_id)  # the decoder's unlink already dropped the link: still a success
        try:
            datadist.query_register_mem_status(comm_id)
            raise AssertionError("query_register_mem_status of an unlinked comm id did not raise")
        except LLMException as e:
            assert e.status_code == LLMStatusCode.LLM_PARAM_INVALID, e.status_code
        cache_manager.unregister_cache(cache.cache_id)
        datadist.finalize()
        logging.info("[prompt] done")
        return

    # blocks 1,3,5,7 of the prompt -> blocks 0,2,4,6 here, every tensor
    cache_manager.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 0), cache, [1, 3, 5, 7], [0, 2, 4, 6])
    for i in range(NUM_TENSORS):
        want = np.zeros(BLOCK_SHAPE, dtype=np.int32)
        want[[0, 2, 4, 6]] = pattern(PROMPT_CLUSTER_ID, i, BLOCK_SHAPE)[[1, 3, 5, 7]]
        assert_equal(f"tensor {i}", tensors[i], want)

    datadist.unlink(comm_id)
    try:
        cache_manager.pull_blocks(BlocksCacheKey(PROMPT_CLUSTER_ID, 0), cache, [0], [0])
        raise AssertionError("pull_blocks after unlink did not raise")
    except LLMException as e:
        assert e.status_code == LLMStatusCode.LLM_NOT_YET_LINK, e.status_code
    signal(sync_dir, "decoder_unlinked")
    cache_manager.unregister_cache(cache.cache_id)
    datadist.finalize()
    logging.info("[decoder] all data verified")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["prompt", "decoder"], required=True)
    parser.add_argument("--ports", type=int, nargs=2, required=True)
    parser.add_argument("--sync", required=True)
    args = parser.parse_args()
    run(args.role, args.ports, args.sync)
