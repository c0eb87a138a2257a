# SPDX-License-Identifier: Apache-2.0
"""Spec §5 cases 14-21: RegisterKvCache / UnregisterKvCache (spec §3.8-3.9)."""
import gc

import numpy as np
import pytest

import kvblocks as kb

S = kb.Status
DT = kb.DataType
NT = 10


@pytest.fixture
def dd():
    d = kb.LlmDataDist(5, kb.LlmRole.PROMPT)
    d.initialize({kb.OPTION_DEVICE_ID: "0"})
    yield d
    d.finalize()
    del d
    gc.collect()


@pytest.fixture
def mem():
    arr = np.zeros((NT, 4, 16), np.int32)
    return arr, [arr[t].ctypes.data for t in range(NT)]


def reject(fn, *args, status=S.LLM_PARAM_INVALID):
    with pytest.raises(kb.LLMException) as ei:
        fn(*args)
    assert ei.value.status_code == status
    return ei.value


def test_case14_register_ok_and_ids_increase(dd, mem):
    arr, addrs = mem
    desc = kb.CacheDesc(NT, DT.DT_INT32, [4, 16])
    a = dd.register_kv_cache(desc, addrs)
    b = dd.register_kv_cache(desc, addrs)  # the same memory twice is tolerated (spec §3.8)
    assert a.cache_id == 1  # ids start at 1 per instance
    assert b.cache_id > a.cache_id
    assert a.tensor_addrs == addrs
    assert a.cache_desc == desc
    assert a.cache_desc.block_bytes == 64 and a.cache_desc.tensor_bytes == 256
    # Cache views alias the registered memory.
    arr[3, 2, 5] = 42
    assert a.numpy(3)[2, 5] == 42
    a.tensor(3)[0] = 9
    assert arr[3, 0, 0] == 9


def test_case14_ids_never_reused(dd, mem):
    _, addrs = mem
    desc = kb.CacheDesc(NT, DT.DT_INT32, [4, 16])
    ids = []
    for _ in range(3):
        c = dd.register_kv_cache(desc, addrs)
        ids.append(c.cache_id)
        dd.unregister_kv_cache(c)
    ids.append(dd.allocate_cache(desc).cache_id)  # one counter for registered and allocated caches
    assert ids == sorted(set(ids))


def test_case15_addrs_empty(dd):
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, [4, 16]), [])


def test_case16_addr_count_mismatch(dd, mem):
    _, addrs = mem
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, [4, 16]), addrs[:9])
    reject(dd.register_kv_cache, kb.CacheDesc(NT - 1, DT.DT_INT32, [4, 16]), addrs)


def test_case17_zero_address(dd, mem):
    _, addrs = mem
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, [4, 16]), addrs[:4] + [0] + addrs[5:])


def test_case18_rank(dd, mem):
    _, addrs = mem
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, []), addrs)
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, [1] * 32), addrs)
    c = dd.register_kv_cache(kb.CacheDesc(NT, DT.DT_INT32, [1] * 31), addrs)
    assert c.cache_id >= 1


@pytest.mark.parametrize("shape", [[4, 0, 16], [-1, 16], [0], [4, -16]])
def test_case19_bad_dims(dd, mem, shape):
    _, addrs = mem
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, shape), addrs)


def test_case19_overflow(dd, mem):
    _, addrs = mem
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT32, [2**62, 2**62]), addrs)
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_INT64, [2**61]), addrs)


def test_case20_undefined_type(dd, mem):
    _, addrs = mem
    reject(dd.register_kv_cache, kb.CacheDesc(NT, DT.DT_UNDEFINED, [4, 16]), addrs)
    # The reserved value 5 is no DataType: the Python boundary refuses it before the runtime sees it
    # (tests/test_enum_args.py); the C++ API answers LLM_PARAM_INVALID.
    with pytest.raises(ValueError, match="data_type=5"):
        kb.CacheDesc(NT, 5, [4, 16])
    # CacheDesc's default data type is DT_UNDEFINED, as in the C++ struct.
    reject(dd.register_kv_cache, kb.CacheDesc(NT, shape=[4, 16]), addrs)


@pytest.mark.parametrize("dt,nbytes", [(DT.DT_FLOAT16, 2), (DT.DT_BF16, 2), (DT.DT_INT8, 1), (DT.DT_INT64, 8),
                                        (DT.DT_STRING, 16), (DT.DT_INT4, None), (DT.DT_UINT1, None)])
def test_data_type_sizes(dd, mem, dt, nbytes):
    _, addrs = mem
    c = dd.register_kv_cache(kb.CacheDesc(NT, dt, [4, 16]), addrs)
    bits = {DT.DT_INT4: 4, DT.DT_UINT1: 1}.get(dt, (nbytes or 0) * 8)
    assert c.cache_desc.tensor_bytes == (4 * 16 * bits + 7) // 8


def test_case21_unregister_unknown(dd):
    dd.unregister_kv_cache(0)
    dd.unregister_kv_cache(999)
    dd.unregister_kv_cache(-1)


def test_unregister_twice(dd, mem):
    _, addrs = mem
    c = dd.register_kv_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 16]), addrs)
    dd.unregister_kv_cache(c)
    dd.unregister_kv_cache(c.cache_id)


def test_unregister_before_initialize():
    d = kb.LlmDataDist(5, kb.LlmRole.PROMPT)
    reject(d.unregister_kv_cache, 0, status=S.LLM_FAILED)
    d.finalize()


def test_register_host_placement(dd, mem):
    _, addrs = mem
    c = dd.register_kv_cache(kb.CacheDesc(NT, DT.DT_INT32, [4, 16], kb.CachePlacement.HOST), addrs)
    assert c.cache_desc.placement == kb.CachePlacement.HOST


def test_register_arrays_derives_desc(dd):
    arrs = [np.zeros((4, 16), np.float16) for _ in range(4)]
    c = dd.register_arrays(arrs)
    assert c.cache_desc == kb.CacheDesc(4, DT.DT_FLOAT16, [4, 16])
    assert c.tensor_addrs == [a.ctypes.data for a in arrs]
    arrs[2][1, 1] = 3
    assert c.numpy(2)[1, 1] == 3


@pytest.mark.parametrize("bad", [[np.zeros((4, 16), np.int32), np.zeros((4, 8), np.int32)],
                                 [np.zeros((4, 16), np.int32), np.zeros((4, 16), np.int64)],
                                 [np.zeros((4, 16), np.int32)[:, ::2]], [], [b"abc"]])
def test_register_arrays_rejects(dd, bad):
    with pytest.raises(TypeError):
        dd.register_arrays(bad)


def test_addrs_types(dd):
    desc = kb.CacheDesc(1, DT.DT_INT32, [4, 16])
    with pytest.raises(TypeError):
        dd.register_kv_cache(desc, [1.5])
    with pytest.raises(ValueError):
        dd.register_kv_cache(desc, [-8])
    with pytest.raises(TypeError):
        dd.register_kv_cache(desc, 0x1000)
