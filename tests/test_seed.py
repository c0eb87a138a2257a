# SPDX-License-Identifier: Apache-2.0
"""The two seed scenarios of issue 2, end to end over a real loopback TCP link, verified byte
for byte through the caches' memoryviews:

* the Decoder pulls blocks {1,3,5,7} of the Prompt's cache into its blocks {0,2,4,6};
* the Prompt pushes with src_layer_range=(3,3), dst_layer_range=(3,3), tensor_num_per_layer=1,
  blocks {0,1,2,3} -> {3,2,1,0}, on 4 tensors of INT32 [4,16].
"""
import os
import struct
import sys

import pytest

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pair  # noqa: E402


def pattern(cluster_id, tensor, nbytes):
    """Distinct bytes per (cluster, tensor, offset): int32 words tagging all three."""
    return b"".join(struct.pack("<i", cluster_id * 10**8 + tensor * 10**5 + i) for i in range(nbytes // 4))


def make_cache(dd, desc, how, keep):
    if how == "allocate":
        return dd.allocate_cache(desc)
    bufs = [bytearray(desc.tensor_bytes) for _ in range(desc.num_tensors)]
    keep.extend(bufs)
    return dd.register_arrays([memoryview(b).cast("i", list(desc.shape)) for b in bufs])


def setup(desc, how):
    pair = Pair()
    keep = []
    pc = make_cache(pair.p, desc, how, keep)
    dc = make_cache(pair.d, desc, how, keep)
    assert pc.cache_desc.block_bytes == dc.cache_desc.block_bytes == 64
    for t in range(desc.num_tensors):
        pc.tensor(t)[:] = pattern(1, t, desc.tensor_bytes)
        dc.tensor(t)[:] = pattern(2, t, desc.tensor_bytes)
    pair.link()  # caches exist before linking, as CANN requires
    return pair, pc, dc, keep


def blocks(cache, t):
    """Tensor t as a list of per-block bytes."""
    raw = bytes(cache.tensor(t))
    bb = cache.cache_desc.block_bytes
    return [raw[i:i + bb] for i in range(0, len(raw), bb)]


@pytest.mark.parametrize("how", ["register", "allocate"])
def test_seed_pull(how):
    desc = kb.CacheDesc(4, kb.DataType.DT_INT32, [8, 16])
    pair, pc, dc, _keep = setup(desc, how)
    try:
        assert pair.d.link_path(1) == "inprocess"
        before_p = [blocks(pc, t) for t in range(4)]
        before_d = [blocks(dc, t) for t in range(4)]
        pair.d.pull_kv_blocks(kb.CacheIndex(1, pc.cache_id), dc, [1, 3, 5, 7], [0, 2, 4, 6])
        for t in range(4):
            got = blocks(dc, t)
            for s, d in zip([1, 3, 5, 7], [0, 2, 4, 6]):
                assert got[d] == before_p[t][s]
            for d in [1, 3, 5, 7]:
                assert got[d] == before_d[t][d]
            assert blocks(pc, t) == before_p[t]  # the source is untouched
    finally:
        pair.close()


@pytest.mark.parametrize("how", ["register", "allocate"])
def test_seed_push(how):
    desc = kb.CacheDesc(4, kb.DataType.DT_INT32, [4, 16])
    pair, pc, dc, _keep = setup(desc, how)
    try:
        before_p = [blocks(pc, t) for t in range(4)]
        before_d = [blocks(dc, t) for t in range(4)]
        ext = kb.KvCacheExtParam(src_layer_range=(3, 3), dst_layer_range=(3, 3), tensor_num_per_layer=1)
        pair.p.push_kv_blocks(pc, kb.CacheIndex(2, dc.cache_id), [0, 1, 2, 3], [3, 2, 1, 0], ext)
        for t in range(3):  # layers 0-2 are not selected
            assert blocks(dc, t) == before_d[t]
        assert blocks(dc, 3) == before_p[3][::-1]
        assert bytes(dc.tensor(3)) == b"".join(before_p[3][::-1])
        for t in range(4):
            assert blocks(pc, t) == before_p[t]
    finally:
        pair.close()


def test_seed_push_equals_pull():
    # The same block mapping gives the same bytes whether P pushes it or D pulls it.
    desc = kb.CacheDesc(4, kb.DataType.DT_INT32, [4, 16])
    pair, pc, dc, _keep = setup(desc, "register")
    try:
        pair.p.push_kv_blocks(pc, kb.CacheIndex(2, dc.cache_id), [0, 1, 2, 3], [3, 2, 1, 0])
        pushed = [bytes(dc.tensor(t)) for t in range(4)]
        for t in range(4):
            dc.tensor(t)[:] = b"\0" * desc.tensor_bytes
        pair.d.pull_kv_blocks(kb.CacheIndex(1, pc.cache_id), dc, [0, 1, 2, 3], [3, 2, 1, 0])
        assert [bytes(dc.tensor(t)) for t in range(4)] == pushed
        assert pushed[2] == b"".join(blocks(pc, 2)[::-1])
    finally:
        pair.close()
