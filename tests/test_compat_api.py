# SPDX-License-Identifier: Apache-2.0
"""kvblocks.llm_datadist: CANN's Python API surface (spec §4) and spec §5 cases 75-91.

One compat LLMDataDist may be initialized per process (as CANN), so the peer here is a plain
kvblocks.LlmDataDist in the same process, linked over loopback.
"""
import gc
import os
import subprocess
import sys
import threading

import pytest

import kvblocks as kb
import kvblocks.llm_datadist as ld
from kvblocks.llm_datadist import (BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex, DataType,
                                   LLMClusterInfo, LLMConfig, LLMDataDist, LLMException, LLMRole, LLMStatusCode,
                                   Placement)

np = pytest.importorskip("numpy")
from ports import free_port  # noqa: E402

P_ID, D_ID = 1, 2
SHAPE = [4, 16]
PI = LLMStatusCode.LLM_PARAM_INVALID



def pattern(owner, t, shape=SHAPE):
    return (np.arange(int(np.prod(shape)), dtype=np.int32) + owner * 1_000_000 + t * 10_000).reshape(shape)


def options(local_comm_res=True, remote=None, listen=None, cache_manager=None):
    cfg = LLMConfig()
    cfg.device_id = 0
    if local_comm_res:
        cfg.local_comm_res = ""
    if remote is not None:
        cfg.enable_remote_cache_accessible = remote
    if cache_manager is not None:
        cfg.enable_cache_manager = cache_manager
    if listen:
        cfg.listen_ip_info = listen
    return cfg.generate_options()


def cluster_info(remote_id, port, local=True):
    c = LLMClusterInfo()
    c.remote_cluster_id = remote_id
    if local:
        c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    return c


class Peer:
    """A kvblocks core instance acting as the remote side: 10 tensors INT32 [4,16], model ids 0 and 5."""

    def __init__(self, num_tensors=10):
        self.port = free_port()
        self.dd = kb.LlmDataDist(P_ID, kb.LlmRole.PROMPT)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                            kb.OPTION_ROLE_CHECK: "0"})
        self.arrays = [pattern(P_ID, t) for t in range(num_tensors)]
        desc = kb.CacheDesc(num_tensors, kb.DataType.DT_INT32, SHAPE)
        self.cache = self.dd._add_cache(desc, [a.ctypes.data for a in self.arrays], 1, 0, self.arrays)
        self.arrays5 = [pattern(P_ID + 50, t) for t in range(num_tensors)]
        self.cache5 = self.dd._add_cache(desc, [a.ctypes.data for a in self.arrays5], 1, 5, self.arrays5)
        self.rows = [pattern(P_ID + 70, t) for t in range(num_tensors)]
        self.rows_cache = self.dd._add_cache(desc, [a.ctypes.data for a in self.rows], 2, -1, self.rows)

    def close(self):
        self.dd.finalize()


@pytest.fixture
def peer():
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def dd():
    d = LLMDataDist(LLMRole.DECODER, D_ID)
    yield d
    d.finalize()
    gc.collect()


def blocks_cache(cm, num_tensors=10, key=None):
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(num_tensors)]
    c = cm.register_blocks_cache(CacheDesc(num_tensors, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in arrays],
                                 key)
    return c, arrays


@pytest.fixture
def linked(peer, dd):
    dd.init(options())
    cm = dd.cache_manager
    cache, arrays = blocks_cache(cm)
    ret, rets = dd.link_clusters([cluster_info(P_ID, peer.port)])
    assert ret == LLMStatusCode.LLM_SUCCESS and rets == [LLMStatusCode.LLM_SUCCESS]
    return dd, cm, cache, arrays, peer


# --------------------------------------------------------------------------- status and enums
def test_status_code_names_values_and_unknown():
    S = LLMStatusCode
    assert issubclass(S, int)
    assert S(1343270917) is S.LLM_PARAM_INVALID
    assert S.LLM_WAIT_PROCESS_TIMEOUT == 0x5010B001 and S.LLM_SEQ_LENOVERLIMIT == 0x5010B011
    assert S.LLM_DEVICE_MEM_ERROR == 507053 and S.LLM_SUSPECT_REMOTE_ERROR == 507057
    assert S.LLM_UNKNOWN_ERROR == -1 and S.LLM_FAILED == 0xFFFFFFFF and S.LLM_TIMEOUT == 0x5010B01A
    assert S(123456) is S.LLM_FAILED
    assert str(S.LLM_SUCCESS) == "LLMStatusCode.LLM_SUCCESS"


def test_exception_type_and_status_code():
    e = LLMException("x", status_code=LLMStatusCode.LLM_TIMEOUT)
    assert isinstance(e, RuntimeError) and isinstance(e, kb.LLMException)
    assert e.status_code is LLMStatusCode.LLM_TIMEOUT
    assert LLMException("y").status_code is LLMStatusCode.LLM_SUCCESS
    st = ld.Status(LLMStatusCode.LLM_SUCCESS)
    assert st.is_ok() and not ld.Status(5).is_ok()


def test_enums():
    assert (LLMRole.PROMPT, LLMRole.DECODER, LLMRole.MIX) == (1, 2, 3)
    assert str(LLMRole.PROMPT) == "LLMRole.PROMPT"
    assert (Placement.HOST, Placement.DEVICE) == (0, 1)
    assert len(DataType) == 14
    assert (DataType.DT_FLOAT16, DataType.DT_BF16, DataType.DT_INT32, DataType.DT_STRING) == (1, 27, 3, 13)
    assert [m.value for m in ld.RegisterMemStatus] == [0, 1, 2]


def test_module_exports():
    for name in ["LLMClusterInfo", "LLMStatusCode", "LLMException", "LLMRole", "LlmConfig", "LLMConfig", "DataType",
                 "Status", "CacheDesc", "CacheKey", "CacheKeyByIdAndIndex", "KvCache", "Cache", "BlocksCacheKey",
                 "LLMDataDist", "Placement", "RegisterMemStatus", "LayerSynchronizer", "TransferConfig", "CacheTask",
                 "TransferWithCacheKeyConfig", "Memtype", "MemInfo"]:
        assert hasattr(ld, name), name
    assert ld.LLMConfig is ld.LlmConfig
    with pytest.raises(ImportError):
        ld.KvCacheManager  # noqa: B018 - V1 only
    with pytest.raises(AttributeError):
        ld.NoSuchThing  # noqa: B018
    from kvblocks.llm_datadist.v2.llm_types import BlocksCacheKey as B2, Cache as C2, CacheDesc as D2
    assert (B2, C2, D2) == (BlocksCacheKey, Cache, CacheDesc)


def test_no_top_level_llm_datadist_outside_the_runner(tmp_path):
    code = "import kvblocks, kvblocks.llm_datadist\ntry:\n import llm_datadist\nexcept ImportError:\n print('absent')"
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(kb.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                       env=env)
    assert "absent" in r.stdout, r.stdout + r.stderr


# --------------------------------------------------------------------------- LlmConfig / cluster info
def test_llm_config_generate_options():
    cfg = LLMConfig()
    cfg.device_id = [0, 1]
    cfg.listen_ip_info = "127.0.0.1:26000"
    cfg.sync_kv_timeout = "3000"
    cfg.local_comm_res = ""
    cfg.enable_switch_role = True
    cfg.ge_options = {"ge.x": "y"}
    o = cfg.generate_options()
    assert o["ge.exec.deviceId"] == "0;1" and o["ge.session_device_id"] == "0"
    assert o["llm.listenIpInfo"] == "127.0.0.1:26000"
    assert o["llm.SyncKvCacheWaitTime"] == "3000"
    assert o["llm.LocalCommRes"] == "" and o["llm.EnableRemoteCacheAccessible"] == "1"
    assert o["llm.EnableSwitchRole"] == "1" and o["llm.MemoryUtilization"] == "0.95" and o["ge.x"] == "y"
    assert cfg.gen_options() == o
    with pytest.raises(ValueError):
        cfg.sync_kv_timeout = 0
    with pytest.raises(TypeError):
        cfg.enable_cache_manager = 1
    with pytest.raises(ValueError):
        cfg.device_id = -1
    with pytest.raises(ValueError):
        cfg.link_retry_count = 0
    with pytest.raises(LLMException):
        cfg.mem_pool_cfg = '{"page_shift": 16}'
    cfg.mem_pool_cfg = '{"memory_size": 1024}'


def test_llm_config_options_is_a_read_only_view_of_generate_options():
    cfg = LLMConfig()
    cfg.device_id = 3
    cfg.enable_cache_manager = True
    view = cfg.options
    assert dict(view) == cfg.generate_options() and view["ge.exec.deviceId"] == "3"
    with pytest.raises(TypeError):
        view["llm.EnableCacheManager"] = "0"  # type: ignore[index]
    with pytest.raises(AttributeError):
        cfg.options = {}  # type: ignore[misc]
    cfg.listen_ip_info = "127.0.0.1:26001"
    assert "llm.listenIpInfo" not in view and cfg.options["llm.listenIpInfo"] == "127.0.0.1:26001"
    assert cfg.generate_options()["llm.EnableCacheManager"] == "1"  # the view changed nothing


def test_cluster_info_ip_encoding():
    c = LLMClusterInfo()
    c.append_local_ip_info("1.2.3.4", 5)
    c.append_remote_ip_info(0x04030201, 6)
    assert c.local_ip_info_list == [(0x04030201, 5)] and c.remote_ip_info_list == [(0x04030201, 6)]
    with pytest.raises(RuntimeError):
        c.append_local_ip_info("not-an-ip", 1)
    with pytest.raises(TypeError):
        c.append_local_ip_info(1.5, 1)
    with pytest.raises(ValueError):
        c.append_local_ip_info("1.2.3.4", 70000)
    with pytest.raises(TypeError):
        c.append_local_ip_info("1.2.3.4", "1")
    with pytest.raises(ValueError):
        c.remote_cluster_id = -1
    assert c.remote_cluster_id is None
    c.remote_role_type = LLMRole.PROMPT


# --------------------------------------------------------------------------- §5 Python cases 75-91
def test_case75_cache_desc_checks():
    with pytest.raises(ValueError):
        CacheDesc(-1, [2, 4], DataType.DT_INT8)
    with pytest.raises(LLMException) as e:
        CacheDesc(1, [], DataType.DT_INT8)
    assert e.value.status_code == PI
    with pytest.raises(TypeError):
        CacheDesc(1, (2, "4"), DataType.DT_INT8)
    with pytest.raises(TypeError):
        CacheDesc(1, [2, 4], 3)
    with pytest.raises(TypeError):
        CacheDesc(1, [2, 4], DataType.DT_INT8, placement=1)
    with pytest.raises(LLMException):
        CacheDesc(1, [2, 4], DataType.DT_INT8, seq_len_dim_index=2)
    d = CacheDesc(2, [4, 8], DataType.DT_FLOAT16, batch_dim_index=1, seq_len_dim_index=0, kv_tensor_format="BSH")
    assert (d.num_tensors, d.shape, d.batch_size, d.batch_dim, d.size) == (2, [4, 8], 8, 1, 64)
    assert d.placement is Placement.DEVICE and d.kv_tensor_format == "BSH"
    d.update_dim(0, 0)
    with pytest.raises(LLMException) as e:
        d.size  # noqa: B018
    assert e.value.status_code == LLMStatusCode.LLM_SUCCESS


def test_case76_cache_key_checks():
    with pytest.raises(LLMException, match="cluster_id is required"):
        CacheKey(req_id=1)
    with pytest.raises(LLMException, match="req_id is required"):
        CacheKey(cluster_id=1)
    with pytest.raises(LLMException, match="Unsupported"):
        CacheKey(cluster_id=1, req_id=1, prefix_id1=1)
    with pytest.raises(ValueError):
        CacheKey(cluster_id=-1, req_id=1)
    with pytest.raises(LLMException):
        CacheKey(1, 2, 3, 4, 5)
    k = CacheKey(prompt_cluster_id=3, req_id=4)
    assert (k.cluster_id, k.req_id, k.model_id, k.prefix_id) == (3, 4, 0, 2**64 - 1)
    k2 = CacheKeyByIdAndIndex(1, 2, 3)
    assert (k2.cluster_id, k2.cache_id, k2.batch_index) == (1, 2, 3)
    with pytest.raises(ValueError):
        CacheKeyByIdAndIndex(1, 2, -1)


def test_case77_blocks_cache_key_checks():
    with pytest.raises(TypeError):
        BlocksCacheKey("aa")
    with pytest.raises(LLMException):
        BlocksCacheKey(model_id=1)
    assert BlocksCacheKey(1, 1).model_id == 1
    assert BlocksCacheKey(prompt_cluster_id=4).cluster_id == 4
    with pytest.raises(LLMException):
        BlocksCacheKey(1, 2, 3)
    with pytest.raises(LLMException):
        BlocksCacheKey(cluster_id=1, foo=2)


def test_case78_second_instance_init_fails(dd):
    dd.init(options())
    other = LLMDataDist(LLMRole.PROMPT, 9)
    with pytest.raises(LLMException, match="multiple") as e:
        other.init(options())
    assert e.value.status_code == LLMStatusCode.LLM_FAILED
    dd.init(options())  # no-op when already initialized


def test_case79_cache_manager_before_init(dd):
    with pytest.raises(RuntimeError, match="not initialized"):
        dd.cache_manager  # noqa: B018


def test_case80_link_clusters_checks(peer, dd):
    dd.init(options(local_comm_res=False, cache_manager=True))
    with pytest.raises(LLMException) as e:
        dd.link_clusters([cluster_info(P_ID, peer.port)], timeout=0)
    assert e.value.status_code == PI
    with pytest.raises(TypeError):
        dd.link_clusters(cluster_info(P_ID, peer.port))
    with pytest.raises(LLMException):
        dd.link_clusters([cluster_info(P_ID, peer.port, local=False)])
    c = LLMClusterInfo()
    c.append_local_ip_info("127.0.0.1", 0)
    with pytest.raises(TypeError):
        dd.link_clusters([c])


def test_case81_pull_tnpl_checks(linked):
    dd, cm, cache, _, _ = linked
    key = BlocksCacheKey(P_ID, 0)
    with pytest.raises(ValueError):
        cm.pull_blocks(key, cache, [0], [0], tensor_num_per_layer=-1)
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(key, cache, [0], [0], tensor_num_per_layer=0)
    assert e.value.status_code == PI
    for bad in (1.0, "x"):
        with pytest.raises(TypeError):
            cm.pull_blocks(key, cache, [0], [0], tensor_num_per_layer=bad)


def test_case82_pull_into_non_blocks_cache(linked):
    dd, cm, _, _, _ = linked
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(10)]
    c = cm.register_cache(CacheDesc(10, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in arrays])
    assert not c.is_blocks_cache
    with pytest.raises(LLMException):
        cm.pull_blocks(BlocksCacheKey(P_ID, 0), c, [0], [0])


def test_case83_84_85_block_list_rules(linked):
    dd, cm, cache, _, _ = linked
    with pytest.raises(LLMException):
        cm.pull_blocks(BlocksCacheKey(1), cache, [], [0])
    with pytest.raises(LLMException):
        cm.pull_blocks(CacheKey(1, 0), cache, [0], [0])
    with pytest.raises(LLMException):
        cm.pull_blocks(BlocksCacheKey(1), cache, [0, 1], [])
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(1), cache, [0, 1], [0])
    assert e.value.status_code == PI
    with pytest.raises(TypeError):
        cm.pull_blocks(BlocksCacheKey(1), cache, np.array([0]), [0])
    with pytest.raises(TypeError):
        cm.pull_blocks("key", cache, [0], [0])
    with pytest.raises(TypeError):
        cm.pull_blocks(BlocksCacheKey(1), object(), [0], [0])


def test_case86_pull_range_rules(linked):
    dd, cm, cache, _, _ = linked
    with pytest.raises(LLMException):
        cm.pull_blocks(BlocksCacheKey(1), cache, [0], [0], src_layer_range=range(0, 4, 2))
    with pytest.raises(TypeError):
        cm.pull_blocks(BlocksCacheKey(1), cache, [0], [0], src_layer_range=[0, 1])


def test_case87_push_needs_remote_cache_access(peer, dd):
    dd.init(options(local_comm_res=False, cache_manager=True))
    cache, _ = blocks_cache(dd.cache_manager)
    with pytest.raises(LLMException) as e:
        dd.cache_manager.push_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [0])
    assert e.value.status_code == PI


def test_case88_push_tnpl_rules(linked):
    dd, cm, cache, arrays, peer = linked
    key = BlocksCacheKey(P_ID, 0)
    kw = dict(src_layer_range=range(0, 1), dst_layer_range=range(0, 1))
    with pytest.raises(LLMException):
        cm.push_blocks(key, cache, [0], [0], tensor_num_per_layer=3, **kw)
    with pytest.raises(LLMException):
        cm.push_blocks(key, cache, [0], [0], tensor_num_per_layer=0, **kw)
    with pytest.raises(ValueError):
        cm.push_blocks(key, cache, [0], [0], tensor_num_per_layer=-1, **kw)
    for bad in (2.0, "x"):
        with pytest.raises(TypeError):
            cm.push_blocks(key, cache, [0], [0], tensor_num_per_layer=bad, **kw)
    arrays[0][1] = 7
    arrays[1][1] = 8
    cm.push_blocks(key, cache, [1], [3], tensor_num_per_layer=2, **kw)
    assert (peer.arrays[0][3] == 7).all() and (peer.arrays[1][3] == 8).all()
    assert peer.arrays[2].tobytes() == pattern(P_ID, 2).tobytes()


def test_case89_push_range_rules(linked):
    dd, cm, cache, _, _ = linked
    with pytest.raises(LLMException):
        cm.push_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [0], src_layer_range=range(0, 2),
                       dst_layer_range=range(0, 1))
    with pytest.raises(LLMException):
        cm.push_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [0], src_layer_range=range(2, 1),
                       dst_layer_range=range(2, 1))
    with pytest.raises(LLMException):
        cm.push_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [0], src_layer_range=range(0, 2, 2),
                       dst_layer_range=range(0, 2, 2))


def test_case90_register_cache_checks(dd):
    dd.init(options())
    cm = dd.cache_manager
    with pytest.raises(LLMException):
        cm.register_cache(CacheDesc(2, SHAPE, DataType.DT_INT32), [1])
    with pytest.raises(LLMException):
        cm.register_cache(CacheDesc(1, SHAPE, DataType.DT_INT32), [0])
    with pytest.raises(LLMException):
        cm.register_cache(CacheDesc(1, SHAPE, DataType.DT_INT32), [])
    with pytest.raises(TypeError):
        cm.register_cache(CacheDesc(1, SHAPE, DataType.DT_INT32), [1], remote_accessible=1)
    # after a rank-table link(), remote_accessible=True is refused (tests/test_compat_rank_table.py links)
    with pytest.raises(LLMException) as e:
        dd.link("comm", {1: 0, 2: 1}, "{}")
    assert e.value.status_code == PI and "rank_table" in str(e.value)
    dd._rank_linked = True
    with pytest.raises(LLMException):
        cm.register_cache(CacheDesc(1, SHAPE, DataType.DT_INT32), [1], remote_accessible=True)


def test_case91_pull_cache_tnpl_not_dividing(dd):
    dd.init(options(local_comm_res=False, cache_manager=True))
    cm = dd.cache_manager
    a = np.zeros(SHAPE, np.int32)
    dst = cm.register_cache(CacheDesc(1, SHAPE, DataType.DT_INT32), [a.ctypes.data])
    with pytest.raises(LLMException) as e:
        cm.pull_cache(CacheKey(2, 0, 0), dst, 0, 4, src_layer_range=range(1), dst_layer_range=range(1))
    assert e.value.status_code == PI


# --------------------------------------------------------------------------- LLMDataDist behaviour
def test_init_finalize_init_again_and_ids_restart(dd):
    with pytest.raises(TypeError):
        LLMDataDist(1, 2)
    with pytest.raises(TypeError):
        dd.init([])
    dd.init(options())
    c1, _ = blocks_cache(dd.cache_manager)
    c2, _ = blocks_cache(dd.cache_manager)
    assert (c1.cache_id, c2.cache_id) == (1, 2)
    dd.finalize()
    dd.finalize()
    with pytest.raises(RuntimeError):
        dd.cache_manager  # noqa: B018
    dd.init(options())
    c3, _ = blocks_cache(dd.cache_manager)
    assert c3.cache_id == 1
    assert dd.cluster_id == D_ID


def test_legacy_mode_has_no_cache_manager(dd):
    dd.init({"ge.exec.deviceId": "0"})
    with pytest.raises(LLMException):
        dd.cache_manager  # noqa: B018
    with pytest.raises(LLMException):
        dd.kv_cache_manager  # noqa: B018


def test_init_option_checks(dd):
    with pytest.raises(LLMException):
        dd.init({"ge.exec.deviceId": "0", "llm.listenIpInfo": "127.0.0.1"})
    with pytest.raises(ValueError):
        dd.init({"ge.exec.deviceId": "0", "llm.listenIpInfo": "127.0.0.1:abc"})
    with pytest.raises(LLMException):
        dd.init({"ge.exec.deviceId": "0", "llm.TransferBackend": "hixl"})
    with pytest.raises(LLMException):
        dd.init({"ge.exec.deviceId": "0", "ge.flowGraphMemMaxSize": "1,2"})
    with pytest.raises(LLMException) as e:
        dd.init({"ge.exec.deviceId": "abc"})
    assert e.value.status_code == PI


def test_link_failure_returns_codes(dd):
    dd.init(options())
    ret, rets = dd.link_clusters([cluster_info(P_ID, free_port())], timeout=500)
    assert ret == LLMStatusCode.LLM_LINK_FAILED and rets == [LLMStatusCode.LLM_LINK_FAILED]


def test_switch_role_exist_link_and_unlink_force(linked):
    dd, cm, cache, arrays, peer = linked
    with pytest.raises(LLMException) as e:
        dd.switch_role(LLMRole.PROMPT, {"llm.listenIpInfo": f"127.0.0.1:{free_port()}"})
    assert e.value.status_code == LLMStatusCode.LLM_EXIST_LINK
    with pytest.raises(TypeError):
        dd.unlink_clusters([cluster_info(P_ID, peer.port)], force=1)
    only_id = LLMClusterInfo()
    only_id.remote_cluster_id = P_ID
    assert dd.unlink_clusters([only_id], force=True) == (LLMStatusCode.LLM_SUCCESS, [LLMStatusCode.LLM_SUCCESS])
    for role in (LLMRole.PROMPT, LLMRole.PROMPT, LLMRole.MIX, LLMRole.DECODER):
        dd.switch_role(role)
    dd.switch_role(LLMRole.PROMPT, switch_options={"llm.listenIpInfo": f"127.0.0.1:{free_port()}"})
    assert dd.role is LLMRole.PROMPT
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [0])
    assert e.value.status_code in (LLMStatusCode.LLM_NOT_YET_LINK, LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)


# --------------------------------------------------------------------------- data movement
def test_pull_blocks_positional_and_keyword(linked):
    dd, cm, cache, arrays, peer = linked
    cm.pull_blocks(BlocksCacheKey(P_ID, 0), cache, [1, 3], [0, 2])
    for t in range(10):
        want = np.zeros(SHAPE, np.int32)
        want[[0, 2]] = pattern(P_ID, t)[[1, 3]]
        assert arrays[t].tobytes() == want.tobytes()
    for a in arrays:
        a[:] = 0
    cm.pull_blocks(src_cache_key=BlocksCacheKey(cluster_id=P_ID, model_id=0), dst_cache=cache, src_blocks=(2,),
                   dst_blocks=(1,), src_layer_range=range(2, 4), dst_layer_range=range(0, 2))
    for t in range(10):
        want = np.zeros(SHAPE, np.int32)
        if t < 4:
            want[1] = pattern(P_ID, t + 4)[2]
        assert arrays[t].tobytes() == want.tobytes()


def test_blocks_cache_key_selects_one_of_several_peer_caches(linked):
    dd, cm, cache, arrays, peer = linked
    cm.pull_blocks(BlocksCacheKey(cluster_id=P_ID, model_id=5), cache, [0], [0])
    assert arrays[0][0].tobytes() == pattern(P_ID + 50, 0)[0].tobytes()
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(cluster_id=P_ID, model_id=9), cache, [0], [0])
    assert e.value.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST


def test_engine_error_codes(linked):
    dd, cm, cache, _, _ = linked
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(99, 0), cache, [0], [0])
    assert e.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [4])
    assert e.value.status_code == PI
    with pytest.raises(LLMException) as e:
        cm.pull_blocks(BlocksCacheKey(P_ID, 0), cache, [0], [0], src_layer_range=range(0, 2),
                       dst_layer_range=range(0, 3))
    assert e.value.status_code == PI


def test_pull_blocks_from_several_threads(linked):
    dd, cm, cache, arrays, peer = linked
    errors = []

    def worker(b):
        try:
            for _ in range(50):
                cm.pull_blocks(BlocksCacheKey(P_ID, 0), cache, [b], [3 - b])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for t in range(10):
        assert arrays[t].tobytes() == pattern(P_ID, t)[::-1].tobytes()


def test_pull_cache_and_push_cache(linked):
    dd, cm, _, _, peer = linked
    rows = [np.zeros(SHAPE, np.int32) for _ in range(10)]
    c = cm.register_cache(CacheDesc(10, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in rows])
    with pytest.raises(TypeError):  # remote-cache access: CacheKeyByIdAndIndex only
        cm.pull_cache(CacheKey(P_ID, 1), c)
    cm.pull_cache(CacheKeyByIdAndIndex(P_ID, peer.rows_cache.cache_id, 2), c, 1)
    for t in range(10):
        want = np.zeros(SHAPE, np.int32)
        want[1] = pattern(P_ID + 70, t)[2]
        assert rows[t].tobytes() == want.tobytes()
    with pytest.raises(LLMException):
        cm.push_cache(CacheKeyByIdAndIndex(P_ID, peer.rows_cache.cache_id, 0), c, 1, size=4)
    cm.push_cache(CacheKeyByIdAndIndex(P_ID, peer.rows_cache.cache_id, 3), c, 1)
    assert peer.rows[5][3].tobytes() == pattern(P_ID + 70, 5)[2].tobytes()


def test_allocate_copy_deallocate_and_swap(dd):
    dd.init(options())
    cm = dd.cache_manager
    desc = CacheDesc(2, SHAPE, DataType.DT_INT32)
    c = cm.allocate_blocks_cache(desc, BlocksCacheKey(D_ID, 3))
    assert c.is_blocks_cache and len(c.tensor_addrs) == 2
    host = [pattern(5, t) for t in range(2)]
    hc = Cache.create_cpu_cache(CacheDesc(2, SHAPE, DataType.DT_INT32, Placement.HOST), [a.ctypes.data for a in host])
    assert hc.cache_id == -1 and hc.is_blocks_cache
    cm.swap_blocks(hc, c, {0: 1, 2: 3})
    cm.copy_blocks(c, {1: [0, 2]})
    back = [np.zeros(SHAPE, np.int32) for _ in range(2)]
    bc = Cache.create_cpu_cache(CacheDesc(2, SHAPE, DataType.DT_INT32, Placement.HOST), [a.ctypes.data for a in back])
    cm.swap_blocks(c, bc, {0: 0, 1: 1, 2: 2, 3: 3})
    for t in range(2):
        src = pattern(5, t)
        want = np.stack([src[0], src[0], src[0], src[2]])
        assert back[t].tobytes() == want.tobytes()
    with pytest.raises(LLMException):
        Cache.create_cpu_cache(desc, [1, 2])
    with pytest.raises(LLMException):
        cm.deallocate_cache(c)
    cm.deallocate_blocks_cache(c)
    rc = cm.allocate_cache(desc, [CacheKey(D_ID, 1)])
    assert not rc.is_blocks_cache
    cm.remove_cache_key(CacheKey(D_ID, 1))
    cm.deallocate_cache(rc)
    cm.unregister_cache(12345)  # unknown ids succeed
    with pytest.raises(LLMException):
        cm.allocate_cache(CacheDesc(0, SHAPE, DataType.DT_INT32))


def test_register_arrays_on_cache_manager(linked):
    dd, cm, _, _, peer = linked
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(10)]
    c = cm.register_arrays(arrays)
    assert c.is_blocks_cache and c.cache_desc.data_type is DataType.DT_INT32 and c.cache_desc.shape == SHAPE
    cm.pull_blocks(BlocksCacheKey(P_ID, 0), c, [3], [0])
    assert arrays[9][0].tobytes() == pattern(P_ID, 9)[3].tobytes()
    with pytest.raises(TypeError):
        cm.register_arrays([np.zeros(SHAPE, np.complex64)])
    with pytest.raises(TypeError):
        cm.register_arrays([np.zeros((4, 16), np.int32)[:, ::2]])


def test_register_arrays_torch_on_cache_manager(linked):
    torch = pytest.importorskip("torch")
    dd, cm, _, _, peer = linked
    dst = [torch.zeros(4, 16, dtype=torch.int32) for _ in range(10)]
    c = cm.register_arrays(dst)
    cm.pull_blocks(BlocksCacheKey(P_ID, 0), c, [2], [1])
    for t in range(10):
        assert dst[t][1].numpy().tobytes() == pattern(P_ID, t)[2].tobytes() and not dst[t][0].any()
