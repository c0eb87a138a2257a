# SPDX-License-Identifier: Apache-2.0
"""CacheManager.transfer_cache_async, remap_registered_memory and the new llm_datadist types:
the numbered cases L1-L16 of spec hixl.md section 4 (each test names its case).

P is the compat LLMDataDist (cluster 1); the peers D (cluster 2, and 3 for L12) are plain
kvblocks engines in the same process, linked over loopback (one compat LLMDataDist per process,
as CANN). tests/test_compat_samples.py runs the two-process form."""
import gc
import threading
import time

import pytest

import kvblocks as kb
from kvblocks.llm_datadist import (BlocksCacheKey, Cache, CacheDesc, CacheKeyByIdAndIndex, DataType, LayerSynchronizer,
                                   LLMClusterInfo, LLMConfig, LLMDataDist, LLMException, LLMRole, LLMStatusCode,
                                   MemInfo, Memtype, Placement, RegisterMemStatus, TransferConfig,
                                   TransferWithCacheKeyConfig)

np = pytest.importorskip("numpy")
from ports import free_port  # noqa: E402

S = LLMStatusCode
SHAPE = [4, 16]  # INT32: 256-byte tensors, 64-byte rows (stride)


def pattern(owner, t, shape=SHAPE):
    return (np.arange(int(np.prod(shape)), dtype=np.int32) + owner * 1_000_000 + t * 10_000).reshape(shape)


def options(remote):
    cfg = LLMConfig()
    cfg.device_id = 0
    if remote:
        cfg.local_comm_res = ""
    else:
        cfg.enable_cache_manager = True
    return cfg.generate_options()


def cluster_info(remote_id, port):
    c = LLMClusterInfo()
    c.remote_cluster_id = remote_id
    c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    return c


class Dst:
    """A peer engine with a contiguous cache `dc` and a blocks cache `db` (key model_id 0), zeroed."""

    def __init__(self, cluster_id):
        self.id = cluster_id
        self.port = free_port()
        self.dd = kb.LlmDataDist(cluster_id, kb.LlmRole.DECODER)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                            kb.OPTION_ROLE_CHECK: "0"})
        desc = kb.CacheDesc(4, kb.DataType.DT_INT32, SHAPE)
        self.c = [np.zeros(SHAPE, np.int32) for _ in range(4)]
        self.dc = self.dd._add_cache(desc, [a.ctypes.data for a in self.c], 2, -1, self.c)
        self.b = [np.zeros(SHAPE, np.int32) for _ in range(4)]
        self.db = self.dd._add_cache(desc, [a.ctypes.data for a in self.b], 1, 0, self.b)

    def addrs(self, arrays, row=0):
        return [a.ctypes.data + row * a.strides[0] for a in arrays]


class Sync(LayerSynchronizer):
    def __init__(self, answer=None):
        self.calls, self.threads = [], set()
        self.answer = answer or (lambda layer: True)

    def synchronize_layer(self, layer_index, timeout_in_millis):
        self.calls.append((layer_index, timeout_in_millis))
        self.threads.add(threading.get_ident())
        return self.answer(layer_index)


def _setup(remote, peers=(2,)):
    ds = [Dst(i) for i in peers]
    p = LLMDataDist(LLMRole.PROMPT, 1)
    p.init(options(remote))
    cm = p.cache_manager
    src = [pattern(1, t) for t in range(4)]
    cache = cm.register_cache(CacheDesc(4, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in src])
    bsrc = [pattern(5, t) for t in range(4)]
    bcache = cm.register_blocks_cache(CacheDesc(4, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in bsrc])
    for d in ds:
        ret, _ = p.link_clusters([cluster_info(d.id, d.port)])
        assert ret == S.LLM_SUCCESS
    return p, cm, ds, (cache, src), (bcache, bsrc)


@pytest.fixture
def env():
    p, cm, ds, c, b = _setup(False)
    yield cm, ds[0], c, b
    p.finalize()
    for d in ds:
        d.dd.finalize()
    gc.collect()


@pytest.fixture
def env_remote():
    p, cm, ds, c, b = _setup(True)
    yield cm, ds[0], c, b
    p.finalize()
    for d in ds:
        d.dd.finalize()
    gc.collect()


# --------------------------------------------------------------------------- types (L1-L3)
def test_L1_transfer_config_checks():
    c = TransferConfig(1, [10, 20])
    assert c.dst_cluster_id == 1 and c.dst_addrs == [10, 20] and c.src_layer_range is None and c.dst_layer_range is None
    with pytest.raises(LLMException) as e:
        TransferConfig(1, [10], range(0, 3, 2))
    assert e.value.status_code == S.LLM_PARAM_INVALID
    with pytest.raises(ValueError):
        TransferConfig(-1, [10])
    with pytest.raises(TypeError):
        TransferConfig(1, None)
    with pytest.raises(TypeError):
        TransferConfig(1, [1], src_layer_range=[0, 1])
    with pytest.raises(LLMException):
        c.src_layer_range = range(2, 1)  # setters re-validate


def test_L2_transfer_with_cache_key_config_checks():
    c = TransferWithCacheKeyConfig(BlocksCacheKey(1), range(0, 2), range(0, 2))
    assert c.dst_cluster_id == 1 and c.src_batch_index == 0
    with pytest.raises(TypeError):
        TransferWithCacheKeyConfig(BlocksCacheKey(1), None, None)
    with pytest.raises(TypeError):
        TransferWithCacheKeyConfig(None, range(0, 1), range(0, 1))
    with pytest.raises(LLMException):
        TransferWithCacheKeyConfig(BlocksCacheKey(1), range(0, 2), range(0, 1))
    with pytest.raises(LLMException):
        TransferWithCacheKeyConfig(BlocksCacheKey(1), range(0, 2), range(0, 2), src_batch_index=1)
    c = TransferWithCacheKeyConfig(CacheKeyByIdAndIndex(1, 5, 0), range(0, 2), range(0, 2), src_batch_index=1)
    assert c.src_batch_index == 1


def test_L3_mem_info_and_register_mem_status():
    m = MemInfo(Memtype.MEM_TYPE_DEVICE, 1234, 10)
    assert (m.mem_type, m.addr, m.size) == (Memtype.MEM_TYPE_DEVICE, 1234, 10)
    assert str(m) == repr(m) == "MemInfo(mem_type=Memtype.MEM_TYPE_DEVICE, addr=1234, size=10)"
    with pytest.raises(AttributeError):
        m.addr = 5
    with pytest.raises(TypeError):
        MemInfo(0, 1, 1)
    assert RegisterMemStatus.PREPARING.value == 1


# --------------------------------------------------------------------------- transfers
def test_L4_all_layers_pushed_synchronizer_called_in_order_on_a_worker_thread(env):
    cm, d, (cache, src), _ = env
    landed = {}

    def answer(layer):
        if layer == 1:  # layer 0 was sent before layer 1 is ready: the pipeline overlaps
            end = time.monotonic() + 5
            while not np.array_equal(d.c[1][0], src[1][0]) and time.monotonic() < end:
                time.sleep(0.001)
            landed[0] = np.array_equal(d.c[0][0], src[0][0]) and np.array_equal(d.c[1][0], src[1][0])
            landed["layer1_before"] = np.array_equal(d.c[2][0], np.zeros(16, np.int32))
        return True

    sync = Sync(answer)
    task = cm.transfer_cache_async(cache, sync, [TransferConfig(2, d.addrs(d.c))])
    assert task.synchronize() == S.LLM_SUCCESS
    assert task.get_results() == [S.LLM_SUCCESS]
    assert sync.calls == [(0, None), (1, None)] and threading.get_ident() not in sync.threads
    assert landed == {0: True, "layer1_before": True}
    for t in range(4):
        assert np.array_equal(d.c[t][0], src[t][0]) and not d.c[t][1:].any()


def test_L5_synchronizer_false_ends_the_task_after_the_layers_sent(env):
    cm, d, (cache, src), _ = env
    task = cm.transfer_cache_async(cache, Sync(lambda layer: layer != 1), [TransferConfig(2, d.addrs(d.c))])
    assert task.get_results() == [S.LLM_PARAM_INVALID]
    assert task.synchronize() == S.LLM_PARAM_INVALID
    assert np.array_equal(d.c[0][0], src[0][0]) and np.array_equal(d.c[1][0], src[1][0])
    assert not d.c[2].any() and not d.c[3].any()


def test_L6_a_layer_range_sends_only_its_layers(env):
    cm, d, (cache, src), _ = env
    sync = Sync()
    task = cm.transfer_cache_async(cache, sync, [TransferConfig(2, d.addrs(d.c[2:]), range(1, 2))])
    assert task.get_results() == [S.LLM_SUCCESS]
    assert sync.calls == [(1, None)]
    assert not d.c[0].any() and not d.c[1].any()
    assert np.array_equal(d.c[2][0], src[2][0]) and np.array_equal(d.c[3][0], src[3][0])


def test_L7_shape_checks_raise_at_once(env):
    cm, d, (cache, src), _ = env
    three = [pattern(1, t) for t in range(3)]
    c3 = cm.register_cache(CacheDesc(3, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in three])
    for args in [(c3, [TransferConfig(2, d.addrs(d.c[:2]))]),
                 (cache, [TransferConfig(2, d.addrs(d.c[:3]))]),
                 (cache, [TransferConfig(2, d.addrs(d.c) * 2, range(0, 3))])]:
        with pytest.raises(LLMException) as e:
            cm.transfer_cache_async(args[0], Sync(), args[1])
        assert e.value.status_code == S.LLM_PARAM_INVALID
    host = Cache.create_cpu_cache(CacheDesc(4, SHAPE, DataType.DT_INT32, Placement.HOST), d.addrs(d.c))
    with pytest.raises(LLMException):
        cm.transfer_cache_async(host, Sync(), [TransferConfig(2, d.addrs(d.c))])
    with pytest.raises(TypeError):
        cm.transfer_cache_async(None, Sync(), [TransferConfig(2, d.addrs(d.c))])
    with pytest.raises(TypeError):
        cm.transfer_cache_async(cache, None, [TransferConfig(2, d.addrs(d.c))])
    assert not any(a.any() for a in d.c)


def test_L8_block_index_checks(env):
    cm, d, (cache, src), (bcache, _) = env
    cfg = [TransferConfig(2, d.addrs(d.b))]
    for kw in [dict(dst_block_indices=[0]), dict(dst_block_memory_size=16), dict(src_block_indices=[0]),
               dict(src_block_indices=[0, 1], dst_block_indices=[0])]:
        with pytest.raises(LLMException) as e:
            cm.transfer_cache_async(bcache if "src_block_indices" in kw else cache, Sync(), cfg, **kw)
        assert e.value.status_code == S.LLM_PARAM_INVALID, kw
    with pytest.raises(ValueError):
        cm.transfer_cache_async(cache, Sync(), cfg, dst_block_indices=[-1], dst_block_memory_size=32)


def test_L9_config_type_must_match_the_mode(env):
    cm, d, (cache, _), _ = env
    with pytest.raises(TypeError):
        cm.transfer_cache_async(cache, Sync(), [TransferWithCacheKeyConfig(BlocksCacheKey(2), range(0, 1),
                                                                           range(0, 1))])


def test_L9_config_type_must_match_the_remote_accessible_mode(env_remote):
    cm, d, (cache, _), _ = env_remote
    with pytest.raises(TypeError):
        cm.transfer_cache_async(cache, Sync(), [TransferConfig(2, d.addrs(d.c))])


def test_L10_get_results_times_out_while_the_synchronizer_blocks(env):
    cm, d, (cache, src), _ = env
    go = threading.Event()
    task = cm.transfer_cache_async(cache, Sync(lambda layer: go.wait(2.0)), [TransferConfig(2, d.addrs(d.c))])
    t0 = time.monotonic()
    assert task.get_results(100) == [S.LLM_TIMEOUT]
    assert 0.08 <= time.monotonic() - t0 < 1.0
    assert task.synchronize(0) == S.LLM_TIMEOUT
    with pytest.raises(TypeError):
        task.get_results("1")
    with pytest.raises(ValueError):
        task.synchronize(-1)
    go.set()
    assert task.synchronize() == S.LLM_SUCCESS and task.get_results() == [S.LLM_SUCCESS]
    assert np.array_equal(d.c[3][0], src[3][0])


def test_L11_unlinked_cluster_is_the_task_result(env):
    cm, d, (cache, _), _ = env
    sync = Sync()
    task = cm.transfer_cache_async(cache, sync, [TransferConfig(9, d.addrs(d.c))])
    assert task.get_results() == [S.LLM_NOT_YET_LINK] and task.synchronize() == S.LLM_NOT_YET_LINK
    # An address no peer registered is refused before any byte moves.
    task = cm.transfer_cache_async(cache, sync, [TransferConfig(2, [12345, 4096, 8, 16])])
    assert task.get_results() == [S.LLM_PARAM_INVALID]
    assert not any(a.any() for a in d.c)


def test_L12_two_clusters_results_in_config_order():
    p, cm, ds, (cache, src), _ = _setup(False, peers=(2, 3))
    try:
        task = cm.transfer_cache_async(cache, Sync(), [TransferConfig(d.id, d.addrs(d.c, row=d.id - 2))
                                                       for d in ds])
        assert task.get_results() == [S.LLM_SUCCESS, S.LLM_SUCCESS]
        assert all(np.array_equal(ds[0].c[t][0], src[t][0]) for t in range(4))
        assert all(np.array_equal(ds[1].c[t][1], src[t][0]) for t in range(4))
    finally:
        p.finalize()
        for d in ds:
            d.dd.finalize()


def test_L13_contiguous_to_blocks_chunks(env):
    cm, d, (cache, src), _ = env
    task = cm.transfer_cache_async(cache, Sync(), [TransferConfig(2, d.addrs(d.b))], dst_block_indices=[2, 0],
                                   dst_block_memory_size=32)
    assert task.get_results() == [S.LLM_SUCCESS]
    for t in range(4):
        got, want = d.b[t].tobytes(), src[t].tobytes()
        assert got[64:96] == want[0:32] and got[0:32] == want[32:64]
        assert got[32:64] == bytes(32) and got[96:] == bytes(160)
    task = cm.transfer_cache_async(cache, Sync(), [TransferConfig(2, d.addrs(d.b))], dst_block_indices=[2, 0],
                                   dst_block_memory_size=256)
    assert task.get_results() == [S.LLM_PARAM_INVALID]


def test_L14_blocks_to_blocks(env):
    cm, d, _, (bcache, bsrc) = env
    task = cm.transfer_cache_async(bcache, Sync(), [TransferConfig(2, d.addrs(d.b))], src_block_indices=[1, 2],
                                   dst_block_indices=[3, 0])
    assert task.get_results() == [S.LLM_SUCCESS]
    for t in range(4):
        assert np.array_equal(d.b[t][3], bsrc[t][1]) and np.array_equal(d.b[t][0], bsrc[t][2])
        assert not d.b[t][1:3].any()
    task = cm.transfer_cache_async(bcache, Sync(), [TransferConfig(2, d.addrs(d.b))], src_block_indices=[9],
                                   dst_block_indices=[1])
    assert task.get_results() == [S.LLM_PARAM_INVALID]
    assert not d.b[0][1:3].any()


def test_L15_remote_accessible_mode_by_cache_id_and_index(env_remote):
    cm, d, (cache, src), _ = env_remote
    key = CacheKeyByIdAndIndex(2, d.dc.cache_id, 1)
    task = cm.transfer_cache_async(cache, Sync(), [TransferWithCacheKeyConfig(key, range(0, 2), range(0, 2))])
    assert task.get_results() == [S.LLM_SUCCESS]
    for t in range(4):
        assert np.array_equal(d.c[t][1], src[t][0]) and not d.c[t][0].any()  # batch offset 64 bytes
    # src layer 1 -> dst layer 0 (kvblocks pairs the ranges by position).
    key0 = CacheKeyByIdAndIndex(2, d.dc.cache_id, 0)
    task = cm.transfer_cache_async(cache, Sync(), [TransferWithCacheKeyConfig(key0, range(1, 2), range(0, 1))])
    assert task.get_results() == [S.LLM_SUCCESS]
    assert np.array_equal(d.c[0][0], src[2][0]) and np.array_equal(d.c[1][0], src[3][0])
    assert not d.c[2][0].any()
    # A blocks cache found by BlocksCacheKey: C2C moves block 0.
    task = cm.transfer_cache_async(cache, Sync(), [TransferWithCacheKeyConfig(BlocksCacheKey(2, 0), range(0, 1),
                                                                              range(0, 1))])
    assert task.get_results() == [S.LLM_SUCCESS]
    assert np.array_equal(d.b[0][0], src[0][0]) and not d.b[2].any()
    task = cm.transfer_cache_async(cache, Sync(), [TransferWithCacheKeyConfig(BlocksCacheKey(2, 7), range(0, 1),
                                                                              range(0, 1))])
    assert task.get_results() == [S.LLM_KV_CACHE_NOT_EXIST]


def test_L16_remap_registered_memory(env):
    cm, d, (cache, _), _ = env
    assert cm.remap_registered_memory(MemInfo(Memtype.MEM_TYPE_DEVICE, cache.tensor_addrs[0], 1024)) is None
    for bad in ([], [MemInfo(Memtype.MEM_TYPE_HOST, 1, 1)], "x", [MemInfo(Memtype.MEM_TYPE_DEVICE, 0, 1)],
                [MemInfo(Memtype.MEM_TYPE_DEVICE, 1, 0)], ["x"]):
        with pytest.raises(LLMException) as e:
            cm.remap_registered_memory(bad)
        assert e.value.status_code == S.LLM_PARAM_INVALID, bad


def test_L16_remap_without_a_link():
    p = LLMDataDist(LLMRole.PROMPT, 1)
    p.init(options(False))
    try:
        with pytest.raises(LLMException) as e:
            p.cache_manager.remap_registered_memory(MemInfo(Memtype.MEM_TYPE_DEVICE, 4096, 16))
        assert e.value.status_code == S.LLM_NOT_YET_LINK
    finally:
        p.finalize()


def test_a_raising_synchronizer_records_failed_for_every_config(env):
    cm, d, (cache, _), _ = env

    def boom(layer):
        raise RuntimeError("user error")

    task = cm.transfer_cache_async(cache, Sync(boom), [TransferConfig(2, d.addrs(d.c))])
    assert task.get_results() == [S.LLM_FAILED] and task.synchronize() == S.LLM_FAILED
