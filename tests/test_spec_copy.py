# SPDX-License-Identifier: Apache-2.0
"""Spec §3.7 (case 12): AllocateCache, DeallocateCache, CopyKvBlocks and CopyKvCache.

CANN V2 answers LLM_FEATURE_NOT_ENABLED for all four; kvblocks implements them with the CANN V1
rules (issue 2 §2), except where noted: AllocateCache also accepts kHost placement (V1 rejects
it), and DeallocateCache of an unknown id succeeds (header comment; the V1 engine answers
LLM_KV_CACHE_NOT_EXIST).
"""
import gc

import numpy as np
import pytest

import kvblocks as kb

S = kb.Status
DT = kb.DataType
NT = 4
DESC = kb.CacheDesc(NT, DT.DT_INT32, [4, 16])


@pytest.fixture
def dd():
    d = kb.LlmDataDist(5, kb.LlmRole.MIX)
    d.initialize({kb.OPTION_DEVICE_ID: "0"})
    yield d
    d.finalize()
    del d
    gc.collect()


def reject(status, fn, *args, **kwargs):
    with pytest.raises(kb.LLMException) as ei:
        fn(*args, **kwargs)
    assert ei.value.status_code == status, S(ei.value.status_code).name
    return ei.value


def fill(cache, offset):
    for t in range(cache.cache_desc.num_tensors):
        a = cache.numpy(t)
        a[:] = (offset + t * 1000 + np.arange(a.size)).reshape(a.shape)


def contents(cache):
    return np.stack([cache.numpy(t).copy() for t in range(cache.cache_desc.num_tensors)])


@pytest.fixture
def two(dd):
    a = dd.allocate_cache(DESC)
    b = dd.allocate_cache(DESC)
    fill(a, 100000)
    fill(b, -100000)
    return a, b


# ---------------------------------------------------------------- AllocateCache
def test_allocate_ok(dd):
    c = dd.allocate_cache(DESC)
    assert c.cache_id >= 1
    assert len(c.tensor_addrs) == NT and all(a != 0 for a in c.tensor_addrs)
    assert len(set(c.tensor_addrs)) == NT
    assert c.cache_desc == DESC
    for t in range(NT):
        assert c.numpy(t).shape == (4, 16) and c.numpy(t).dtype == np.int32
        assert not c.numpy(t).any()  # fresh shared memory is zeroed


def test_allocate_host_placement(dd):
    # CANN V1 rejects placement != kDevice; kvblocks serves both (issue 2 §2).
    c = dd.allocate_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 16], kb.CachePlacement.HOST))
    assert c.cache_desc.placement == kb.CachePlacement.HOST


def test_allocate_num_tensors_zero(dd):
    reject(S.LLM_PARAM_INVALID, dd.allocate_cache, kb.CacheDesc(0, DT.DT_INT32, [4, 16]))


@pytest.mark.parametrize("shape", [[], [1] * 32, [4, 0], [-1, 16]])
def test_allocate_bad_shape(dd, shape):
    reject(S.LLM_PARAM_INVALID, dd.allocate_cache, kb.CacheDesc(NT, DT.DT_INT32, shape))


def test_allocate_size_overflow(dd):
    reject(S.LLM_PARAM_INVALID, dd.allocate_cache, kb.CacheDesc(NT, DT.DT_INT8, [2**62, 4]))


def test_allocate_undefined_type(dd):
    reject(S.LLM_PARAM_INVALID, dd.allocate_cache, kb.CacheDesc(NT, DT.DT_UNDEFINED, [4, 16]))


def test_allocate_out_of_memory(dd):
    # 2**58 bytes: beyond any x86-64/arm64 address space, so the mapping fails cleanly.
    e = reject(S.LLM_DEVICE_OUT_OF_MEMORY, dd.allocate_cache, kb.CacheDesc(1, DT.DT_INT8, [2**58]))
    assert isinstance(e, kb.LLMOutOfMemoryError) and isinstance(e, MemoryError)


def test_deallocate(dd, two):
    a, b = two
    view = a.numpy(0)
    dd.deallocate_cache(a)
    view[0, 0] = 1  # views keep the memory mapped after deallocation
    reject(S.LLM_KV_CACHE_NOT_EXIST, dd.copy_kv_blocks, a, b, [0], [[0]])
    dd.deallocate_cache(a)  # again: unknown id succeeds
    dd.deallocate_cache(0)


def test_allocated_cache_is_transferable():
    # An allocated cache serves pulls like a registered one.
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import Pair
    p = Pair()
    try:
        pc = p.p.allocate_cache(DESC)
        dc = p.d.allocate_cache(DESC)
        fill(pc, 7)
        p.link()
        p.d.pull_kv_blocks(kb.CacheIndex(1, pc.cache_id), dc, [1, 3], [0, 2])
        for t in range(NT):
            np.testing.assert_array_equal(dc.numpy(t)[[0, 2]], pc.numpy(t)[[1, 3]])
            assert not dc.numpy(t)[[1, 3]].any()
    finally:
        p.close()


# ---------------------------------------------------------------- CopyKvBlocks
def test_copy_blocks_v1_example(dd, two):
    # Spec §3.7 [TEST V1 CopyKvBlocks]: {0,2} -> {{1,3}} copies block 0 -> 1 and 2 -> 3.
    a, b = two
    before = contents(b)
    dd.copy_kv_blocks(a, b, [0, 2], [[1, 3]])
    want = before.copy()
    want[:, 1] = contents(a)[:, 0]
    want[:, 3] = contents(a)[:, 2]
    np.testing.assert_array_equal(contents(b), want)


def test_copy_blocks_several_dst_lists(dd, two):
    a, b = two
    before = contents(b)
    dd.copy_kv_blocks(a, b, [3], [[0], [1], [2]])
    want = before.copy()
    want[:, 0:3] = contents(a)[:, 3:4]
    np.testing.assert_array_equal(contents(b), want)


def test_copy_blocks_within_one_cache(dd, two):
    a, _ = two
    before = contents(a)
    dd.copy_kv_blocks(a, a, [0], [[3]])
    want = before.copy()
    want[:, 3] = before[:, 0]
    np.testing.assert_array_equal(contents(a), want)


def test_copy_blocks_registered_caches(dd):
    src = np.arange(NT * 64, dtype=np.int32).reshape(NT, 4, 16)
    dst = np.zeros_like(src)
    a = dd.register_arrays(list(src))
    b = dd.register_arrays(list(dst))
    dd.copy_kv_blocks(a, b.cache_id, [1, 2], [[2, 1]])
    np.testing.assert_array_equal(dst[:, 2], src[:, 1])
    np.testing.assert_array_equal(dst[:, 1], src[:, 2])
    assert not dst[:, [0, 3]].any()


def _rejected_copy(dd, two, status, *args):
    a, b = two
    snap = contents(a), contents(b)
    reject(status, dd.copy_kv_blocks, *args)
    np.testing.assert_array_equal(contents(a), snap[0])
    np.testing.assert_array_equal(contents(b), snap[1])


def test_copy_blocks_src_empty(dd, two):
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], two[1], [], [[]])


def test_copy_blocks_dst_list_empty(dd, two):
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], two[1], [0], [])


def test_copy_blocks_inner_length(dd, two):
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], two[1], [0, 1], [[2, 3], [2]])


def test_copy_blocks_index_bounds(dd, two):
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], two[1], [4], [[0]])
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], two[1], [0, 1], [[1, 2], [3, 4]])


def test_copy_blocks_block_bytes_differ(dd, two):
    c = dd.allocate_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 8]))
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], c, [0], [[0]])


def test_copy_blocks_tensor_count_differs(dd, two):
    c = dd.allocate_cache(kb.CacheDesc(NT + 2, DT.DT_INT32, [4, 16]))
    _rejected_copy(dd, two, S.LLM_PARAM_INVALID, two[0], c, [0], [[0]])


def test_copy_blocks_host_to_host(dd, two):
    h1 = dd.allocate_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 16], kb.CachePlacement.HOST))
    h2 = dd.allocate_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 16], kb.CachePlacement.HOST))
    reject(S.LLM_PARAM_INVALID, dd.copy_kv_blocks, h1, h2, [0], [[1]])
    # Host <-> device combinations are swaps, and allowed.
    dd.copy_kv_blocks(h1, two[0], [0], [[1]])
    dd.copy_kv_blocks(two[0], h1, [0], [[1]])


def test_copy_blocks_unknown_cache(dd, two):
    _rejected_copy(dd, two, S.LLM_KV_CACHE_NOT_EXIST, two[0], 999, [0], [[0]])
    _rejected_copy(dd, two, S.LLM_KV_CACHE_NOT_EXIST, 999, two[1], [0], [[0]])


def test_copy_blocks_python_types(dd, two):
    with pytest.raises(TypeError):
        dd.copy_kv_blocks(two[0], two[1], [0], [0])
    with pytest.raises(TypeError):
        dd.copy_kv_blocks(two[0], two[1], [0], 0)
    with pytest.raises(ValueError):
        dd.copy_kv_blocks(two[0], two[1], [0], [[-1]])


# ---------------------------------------------------------------- CopyKvCache
def test_copy_cache_row(dd, two):
    a, b = two
    before = contents(b)
    dd.copy_kv_cache(a, b, 2, 1)
    want = before.copy()
    want[:, 1] = contents(a)[:, 2]
    np.testing.assert_array_equal(contents(b), want)


def test_copy_cache_offset_size(dd, two):
    a, b = two
    before = contents(b)
    dd.copy_kv_cache(a, b, 3, 0, offset=8, size=16)  # bytes 8..24 = int32 elements 2..6
    want = before.copy()
    want[:, 0, 2:6] = contents(a)[:, 3, 2:6]
    np.testing.assert_array_equal(contents(b), want)
    before = contents(b)
    dd.copy_kv_cache(a, b, 0, 2, offset=60)  # the rest of the row: element 15
    want = before.copy()
    want[:, 2, 15] = contents(a)[:, 0, 15]
    np.testing.assert_array_equal(contents(b), want)


@pytest.mark.parametrize("kwargs", [dict(src_batch_index=4), dict(dst_batch_index=4), dict(offset=64),
                                    dict(size=0), dict(size=-2), dict(size=65), dict(offset=60, size=8)],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_copy_cache_rejected(dd, two, kwargs):
    a, b = two
    snap = contents(a), contents(b)
    reject(S.LLM_PARAM_INVALID, dd.copy_kv_cache, a, b, **kwargs)
    np.testing.assert_array_equal(contents(a), snap[0])
    np.testing.assert_array_equal(contents(b), snap[1])


def test_copy_cache_host_source(dd, two):
    h = dd.allocate_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 16], kb.CachePlacement.HOST))
    reject(S.LLM_PARAM_INVALID, dd.copy_kv_cache, h, two[1])
    dd.copy_kv_cache(two[0], h)  # device -> host is allowed


def test_copy_cache_unknown(dd, two):
    reject(S.LLM_KV_CACHE_NOT_EXIST, dd.copy_kv_cache, two[0], 999)
    reject(S.LLM_KV_CACHE_NOT_EXIST, dd.copy_kv_cache, 999, two[1])
