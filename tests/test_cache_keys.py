# SPDX-License-Identifier: Apache-2.0
"""CacheKey -> batch index, key release after pull_cache, and pull_blocks from a contiguous cache
(spec hixl.md 3.4, cases L17-L22; each test names its case).

The owner P is a plain kvblocks engine binding keys exactly as the compat CacheManager does
(``_set_batch_keys``); the puller D is the compat LLMDataDist (one per process, as CANN). The
two-process forms run as compat samples (tests/test_compat_samples.py)."""
import gc

import pytest

import kvblocks as kb
from kvblocks.llm_datadist import (CacheDesc, CacheKey, CacheKeyByIdAndIndex, DataType, LLMClusterInfo, LLMConfig,
                                   LLMDataDist, LLMException, LLMRole, LLMStatusCode)

np = pytest.importorskip("numpy")
from ports import free_port  # noqa: E402

P_ID, D_ID = 1, 2
SHAPE = [2, 64]  # INT32: batch rows of 256 bytes
S = LLMStatusCode
PLACEHOLDER = CacheKey(P_ID, 2**64 - 1)


class Owner:
    def __init__(self):
        self.port = free_port()
        self.dd = kb.LlmDataDist(P_ID, kb.LlmRole.PROMPT)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                            kb.OPTION_ROLE_CHECK: "0"})
        self.desc = kb.CacheDesc(4, kb.DataType.DT_INT32, SHAPE)

    def allocate(self, keys, owner_tag=0):
        c = self.dd._add_cache(self.desc, None, 2, keys[0]._key() if keys else -1, None)
        self.dd._set_batch_keys(c, [-1 if k is PLACEHOLDER else k._key() for k in keys])
        for t in range(4):
            c.numpy(t)[:] = np.arange(128, dtype=np.int32).reshape(SHAPE) + 1000 * t + 100_000 * owner_tag
        return c

    def register(self, keys):
        arrays = [np.arange(128, dtype=np.int32).reshape(SHAPE) + 7000 * t for t in range(4)]
        c = self.dd._add_cache(self.desc, [a.ctypes.data for a in arrays], 2, keys[0]._key(), arrays)
        self.dd._set_batch_keys(c, [k._key() for k in keys])
        return c, arrays


def options():
    cfg = LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    return cfg.generate_options()


def link(d, port):
    c = LLMClusterInfo()
    c.remote_cluster_id = P_ID
    c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    ret, _ = d.link_clusters([c])
    assert ret == S.LLM_SUCCESS


@pytest.fixture
def pair():
    owner = Owner()
    d = LLMDataDist(LLMRole.DECODER, D_ID)
    d.init(options())
    cm = d.cache_manager
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(4)]
    local = cm.register_cache(CacheDesc(4, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in arrays])
    yield owner, d, cm, local, arrays
    d.finalize()
    owner.dd.finalize()
    gc.collect()


def rows(cache, b):
    return [cache.numpy(t)[b].copy() for t in range(4)]


def test_L17_each_key_has_its_batch_and_is_released_after_the_pull(pair):
    owner, d, cm, local, arrays = pair
    k0, k1 = CacheKey(P_ID, 10), CacheKey(P_ID, 11)
    src = owner.allocate([k0, k1])
    link(d, owner.port)
    cm.pull_cache(k1, local, batch_index=0)
    assert all(np.array_equal(arrays[t][0], r) for t, r in enumerate(rows(src, 1)))  # negative control: batch 0
    assert not any(a[1].any() for a in arrays)
    with pytest.raises(LLMException) as e:
        cm.pull_cache(k1, local, batch_index=1)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    cm.pull_cache(k0, local, batch_index=1)  # the other key is still there, at batch 0
    assert all(np.array_equal(arrays[t][1], r) for t, r in enumerate(rows(src, 0)))


def test_L18_keys_of_a_registered_cache_are_never_released(pair):
    owner, d, cm, local, arrays = pair
    k0 = CacheKey(P_ID, 20)
    _, src = owner.register([k0])
    link(d, owner.port)
    cm.pull_cache(k0, local)
    cm.pull_cache(k0, local, batch_index=1)
    assert np.array_equal(arrays[2][1], src[2][0])


def test_L19_placeholder_and_cache_id_index(pair):
    owner, d, cm, local, arrays = pair
    k1 = CacheKey(P_ID, 31)
    src = owner.allocate([PLACEHOLDER, k1])
    link(d, owner.port)
    cm.pull_cache(k1, local, batch_index=0)
    assert np.array_equal(arrays[3][0], src.numpy(3)[1])
    cm.pull_cache(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), local, batch_index=1)
    assert np.array_equal(arrays[3][1], src.numpy(3)[0])


def test_L19_owner_side_key_checks():
    d = LLMDataDist(LLMRole.PROMPT, P_ID)
    d.init(options())
    try:
        cm = d.cache_manager
        desc = CacheDesc(4, SHAPE, DataType.DT_INT32)
        with pytest.raises(LLMException) as e:
            cm.allocate_cache(desc, [CacheKey(P_ID, 1), CacheKey(P_ID, 2), CacheKey(P_ID, 3)])
        assert e.value.status_code == S.LLM_PARAM_INVALID
        with pytest.raises(LLMException):
            cm.allocate_cache(desc, [CacheKey(P_ID, 1), CacheKey(P_ID, 1)])
        c = cm.allocate_cache(desc, [CacheKey(P_ID, 1), PLACEHOLDER])
        with pytest.raises(LLMException) as e:
            cm.allocate_cache(desc, [CacheKey(P_ID, 1)])
        assert e.value.status_code == S.LLM_PARAM_INVALID
        cm.allocate_cache(desc, [PLACEHOLDER, PLACEHOLDER])  # placeholders may repeat [KVB]
        assert cm.remove_cache_key(CacheKey(P_ID, 1)) is None
        assert cm.remove_cache_key(CacheKey(P_ID, 99)) is None  # unknown: no-op
        cm.allocate_cache(desc, [CacheKey(P_ID, 1)])  # unbound by remove_cache_key
        cm.deallocate_cache(c)
    finally:
        d.finalize()


def test_L21_layer_ranged_pulls_release_the_key_after_the_last_layer(pair):
    owner, d, cm, local, arrays = pair
    k0 = CacheKey(P_ID, 40)
    src = owner.allocate([k0])
    link(d, owner.port)
    cm.pull_cache(k0, local, src_layer_range=range(0, 1), dst_layer_range=range(0, 1))
    assert np.array_equal(arrays[1][0], src.numpy(1)[0]) and not arrays[2].any()
    cm.pull_cache(k0, local, src_layer_range=range(1, 2), dst_layer_range=range(1, 2))
    assert np.array_equal(arrays[3][0], src.numpy(3)[0])
    with pytest.raises(LLMException) as e:
        cm.pull_cache(k0, local)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST


def test_L22_a_pull_by_cache_id_and_index_counts_as_a_pull_by_its_key(pair):
    owner, d, cm, local, arrays = pair
    k0, k1 = CacheKey(P_ID, 50), CacheKey(P_ID, 51)
    src = owner.allocate([k0, k1])
    link(d, owner.port)
    cm.pull_cache(CacheKeyByIdAndIndex(P_ID, src.cache_id, 1), local)
    assert np.array_equal(arrays[0][0], src.numpy(0)[1])
    with pytest.raises(LLMException) as e:
        cm.pull_cache(k1, local)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    cm.pull_cache(k0, local)  # k0 untouched


def test_pull_blocks_from_a_contiguous_cache_cuts_the_row_into_local_blocks(pair):
    # spec hixl.md 3.5 pull_from_cache_to_blocks: a 256-byte row, local blocks of 64 bytes.
    owner, d, cm, _, _ = pair
    k0 = CacheKey(P_ID, 60)
    src = owner.allocate([PLACEHOLDER, k0])
    blocks = [np.zeros((8, 16), np.int32) for _ in range(4)]
    bc = cm.register_blocks_cache(CacheDesc(4, [8, 16], DataType.DT_INT32), [a.ctypes.data for a in blocks])
    link(d, owner.port)
    cm.pull_blocks(k0, bc, src_blocks=[], dst_blocks=[5, 2, 7])
    for t in range(4):
        row = src.numpy(t)[1].reshape(4, 16)  # batch 1: chunk j = row[j]
        assert np.array_equal(blocks[t][5], row[0]) and np.array_equal(blocks[t][2], row[1])
        assert np.array_equal(blocks[t][7], row[2])
        assert not blocks[t][[0, 1, 3, 4, 6]].any()
    with pytest.raises(LLMException) as e:  # consumed
        cm.pull_blocks(k0, bc, dst_blocks=[0])
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    with pytest.raises(LLMException) as e:  # 5 chunks of a 4-block row
        cm.pull_blocks(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), bc, dst_blocks=[0, 1, 2, 3, 4])
    assert e.value.status_code == S.LLM_PARAM_INVALID
    with pytest.raises(LLMException) as e:  # local block out of range
        cm.pull_blocks(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), bc, dst_blocks=[8])
    assert e.value.status_code == S.LLM_PARAM_INVALID
    assert not blocks[0][0].any()
    cm.pull_blocks(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), bc, dst_blocks=[0], src_layer_range=range(1, 2),
                   dst_layer_range=range(1, 2))
    assert np.array_equal(blocks[2][0], src.numpy(2)[0].reshape(4, 16)[0]) and not blocks[0][0].any()


def test_cache_per_device_tensor_addrs(pair):
    _, _, cm, local, arrays = pair
    assert local.per_device_tensor_addrs == [[a.ctypes.data for a in arrays]] == [local.tensor_addrs]
