# SPDX-License-Identifier: Apache-2.0
"""Rank-table linking of the compat package (``LLMDataDist.link`` / ``query_register_mem_status`` /
``unlink``) and, with ``llm.TransferBackend=hixl``, unlinking by cluster id alone (issue 31).

The two-process cases run CANN-style programs from ``compat_samples/`` through
``python -m kvblocks.compat``; the argument and rank-table checks run in this process against a
kvblocks core peer.
"""
import json
import time

import pytest

import kvblocks as kb
from kvblocks.llm_datadist import (BlocksCacheKey, CacheDesc, DataType, LLMConfig, LLMDataDist, LLMException, LLMRole,
                                   LLMStatusCode, RegisterMemStatus)
from kvblocks.llm_datadist.v2.rank_table import listener_of, parse_rank_table

np = pytest.importorskip("numpy")
from ports import free_port  # noqa: E402
from test_compat_samples import run_processes  # noqa: E402

PI = LLMStatusCode.LLM_PARAM_INVALID
ME, PEER = 2, 1
SHAPE = [4, 16]


# --------------------------------------------------------------------------- two processes
def test_rank_table_link_pull_unlink_two_processes(tmp_path):
    pp, pd = free_port(), free_port()
    t0 = time.monotonic()
    outs = run_processes("rank_table_pull_blocks_sample.py", [["--role", "prompt", "--ports", pp, pd],
                                                              ["--role", "decoder", "--ports", pp, pd]],
                         tmp_path, timeout=30)
    assert "all data verified" in outs[1]
    assert time.monotonic() - t0 < 15


def test_hixl_backend_unlink_by_cluster_id_two_processes(tmp_path):
    pp, pd = free_port(), free_port()
    outs = run_processes("hixl_backend_unlink_sample.py", [["--role", "prompt", "--ports", pp, pd],
                                                           ["--role", "decoder", "--ports", pp, pd]],
                         tmp_path, timeout=30)
    assert "all data verified, unlinked by cluster id" in outs[1]
    assert "link gone on this side too" in outs[0]


# --------------------------------------------------------------------------- one process
def rank_table(devices, status="completed", version="1.2"):
    """devices: (rank_id, device_port or None) per device, one server each."""
    servers = []
    for rank, port in devices:
        dev = {"device_id": "0", "device_ip": "127.0.0.1", "rank_id": str(rank)}
        if port is not None:
            dev["device_port"] = port
        servers.append({"server_id": f"s{rank}", "device": [dev]})
    return json.dumps({"server_count": str(len(servers)), "server_list": servers, "status": status,
                       "version": version})


@pytest.fixture
def dd():
    d = LLMDataDist(LLMRole.DECODER, ME)
    yield d
    d.finalize()


def init(d, listen_port=None, link_total_time=None, cache_manager=True):
    cfg = LLMConfig()
    cfg.device_id = 0
    if cache_manager:
        cfg.local_comm_res = ""
    if listen_port is not None:
        cfg.listen_ip_info = f"127.0.0.1:{listen_port}"
    if link_total_time is not None:
        cfg.link_total_time = link_total_time
    d.init(cfg.generate_options())


class Peer:
    """A kvblocks core engine (cluster PEER) listening on loopback with one blocks cache, model id 0."""

    def __init__(self):
        self.port = free_port()
        self.dd = kb.LlmDataDist(PEER, kb.LlmRole.PROMPT)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                            kb.OPTION_ROLE_CHECK: "0"})
        self.arrays = [(np.arange(64, dtype=np.int32) + 1000 * t).reshape(SHAPE) for t in range(2)]
        desc = kb.CacheDesc(2, kb.DataType.DT_INT32, SHAPE)
        self.cache = self.dd._add_cache(desc, [a.ctypes.data for a in self.arrays], 1, 0, self.arrays)

    def close(self):
        self.dd.finalize()


@pytest.fixture
def peer():
    p = Peer()
    yield p
    p.close()


def wait_status(d, comm_id, want, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        st = d.query_register_mem_status(comm_id)
        if st == want or time.monotonic() > deadline:
            return st
        time.sleep(0.01)


def test_link_query_pull_unlink_in_process(dd, peer):
    init(dd, free_port())
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(2)]
    cache = dd.cache_manager.register_blocks_cache(CacheDesc(2, SHAPE, DataType.DT_INT32),
                                                   [a.ctypes.data for a in arrays])
    comm_id = dd.link("comm", {PEER: 0, ME: 1}, rank_table([(0, peer.port), (1, 1)]))
    assert isinstance(comm_id, int) and comm_id > 0
    assert wait_status(dd, comm_id, RegisterMemStatus.OK) == RegisterMemStatus.OK
    assert peer.dd.link_path(ME) != ""  # one link, usable both ways
    dd.cache_manager.pull_blocks(BlocksCacheKey(PEER, 0), cache, [3, 1], [0, 2])
    for t in range(2):
        assert arrays[t][0].tolist() == peer.arrays[t][3].tolist()
        assert arrays[t][2].tolist() == peer.arrays[t][1].tolist()
    dd.unlink(comm_id)
    assert dd._engine.link_path(PEER) == ""
    deadline = time.monotonic() + 5
    while peer.dd.link_path(ME) != "" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.dd.link_path(ME) == ""  # a non-force unlink: the peer's side is gone too
    with pytest.raises(LLMException) as e:
        dd.cache_manager.pull_blocks(BlocksCacheKey(PEER, 0), cache, [0], [0])
    assert e.value.status_code == LLMStatusCode.LLM_NOT_YET_LINK
    for call in (dd.query_register_mem_status, dd.unlink):
        with pytest.raises(LLMException) as e:
            call(comm_id)
        assert e.value.status_code == PI and str(comm_id) in str(e.value)


def test_ok_stays_after_the_peer_unlinked_and_unlink_still_succeeds(dd, peer):
    init(dd, free_port())
    comm_id = dd.link("comm", {PEER: 0, ME: 1}, rank_table([(0, peer.port), (1, 1)]))
    assert wait_status(dd, comm_id, RegisterMemStatus.OK) == RegisterMemStatus.OK
    assert peer.dd.unlink_llm_clusters([kb.ClusterInfo(ME)]) == [kb.Status.LLM_SUCCESS]  # by cluster id
    deadline = time.monotonic() + 5
    while dd._engine.link_path(PEER) != "" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dd._engine.link_path(PEER) == ""
    assert dd.query_register_mem_status(comm_id) == RegisterMemStatus.OK
    dd.unlink(comm_id)


def test_comm_ids_are_unique_and_query_reports_failed(dd):
    init(dd, free_port(), link_total_time=1)
    dead = free_port()  # nothing listens there
    t0 = time.monotonic()
    a = dd.link("comm_a", {PEER: 0, ME: 1}, rank_table([(0, dead), (1, 1)]))
    b = dd.link("comm_b", {PEER: 0, ME: 1}, rank_table([(0, dead), (1, 1)]))
    assert a != b and a > 0 and b > 0
    assert dd.query_register_mem_status(a) == RegisterMemStatus.PREPARING
    assert wait_status(dd, a, RegisterMemStatus.FAILED, 5) == RegisterMemStatus.FAILED
    assert wait_status(dd, b, RegisterMemStatus.FAILED, 5) == RegisterMemStatus.FAILED
    assert time.monotonic() - t0 < 5
    dd.unlink(a)  # nothing was linked: nothing to tear down
    dd.unlink(b)


def test_unknown_comm_id(dd):
    init(dd)
    for call in (dd.query_register_mem_status, dd.unlink):
        with pytest.raises(LLMException) as e:
            call(12345)
        assert e.value.status_code == PI
        with pytest.raises(TypeError):
            call("1")


def test_finalize_stops_a_pending_link(dd):
    init(dd, free_port())
    dd.link("comm", {PEER: 0, ME: 1}, rank_table([(0, free_port()), (1, 1)]))
    t0 = time.monotonic()
    dd.finalize()
    assert time.monotonic() - t0 < 3


GOOD = json.loads(rank_table([(0, 5000), (1, 5001)]))


def edited(fn):
    doc = json.loads(json.dumps(GOOD))
    fn(doc)
    return json.dumps(doc)


BAD_TABLES = [
    ("{not json", "not valid JSON"),
    ("[]", "must be a JSON object"),
    (edited(lambda d: d.pop("status")), 'has no "status"'),
    (edited(lambda d: d.update(status="initializing")), "status must be \"completed\", got 'initializing'"),
    (edited(lambda d: d.pop("version")), 'has no "version"'),
    (edited(lambda d: d.update(version="2.0")), "version must be one of '1.0', '1.2', got '2.0'"),
    (edited(lambda d: d.pop("server_list")), 'has no "server_list"'),
    (edited(lambda d: d.update(server_list=[])), "server_list must be a non-empty list"),
    (edited(lambda d: d["server_list"][1].pop("server_id")), "server_list[1] has no server_id"),
    (edited(lambda d: d["server_list"][0].pop("device")), "server_list[0] has no device"),
    (edited(lambda d: d["server_list"][1]["device"][0].pop("device_ip")), "server_list[1].device[0] has no device_ip"),
    (edited(lambda d: d["server_list"][0]["device"][0].pop("rank_id")), "server_list[0].device[0] has no rank_id"),
    (edited(lambda d: d["server_list"][0]["device"][0].pop("device_id")),
     "server_list[0].device[0] has no device_id"),
    (edited(lambda d: d["server_list"][0]["device"][0].update(device_ip="127.0.0.1:5000")),
     "server_list[0].device[0].device_ip must be an IPv4 address without a port"),
    (edited(lambda d: d["server_list"][0]["device"][0].update(rank_id="x")),
     "server_list[0].device[0].rank_id must be a non-negative integer"),
    (edited(lambda d: d["server_list"][0]["device"][0].update(device_port=70000)),
     "server_list[0].device[0].device_port must be a non-negative integer (at most 65535)"),
    (edited(lambda d: d["server_list"][1]["device"][0].update(rank_id="0")),
     "server_list[1].device[0].rank_id 0 is also at server_list[0].device[0]"),
    (edited(lambda d: d["server_list"][1]["device"][0].update(rank_id="7")),
     "rank_id 1 (cluster_rank_info[2]) is not in server_list"),
]


@pytest.mark.parametrize("table,msg", BAD_TABLES, ids=[m for _, m in BAD_TABLES])
def test_bad_rank_table_names_the_field(dd, table, msg):
    init(dd, free_port())
    with pytest.raises(LLMException) as e:
        dd.link("comm", {PEER: 0, ME: 1}, table)
    assert e.value.status_code == PI
    assert msg in str(e.value), str(e.value)
    assert "rank_table" in str(e.value)


def test_argument_checks_as_cann(dd):
    init(dd, free_port())
    table = json.dumps(GOOD)
    for name, info in [("", {PEER: 0, ME: 1}), ("x" * 128, {PEER: 0, ME: 1}), ("c", {ME: 0}),
                       ("c", {1: 0, 2: 1, 3: 2, 4: 3, 5: 4}), ("c", {PEER: 1, ME: 0}), ("c", {PEER: 1, ME: 1})]:
        with pytest.raises(LLMException) as e:
            dd.link(name, info, table)
        assert e.value.status_code == PI
    with pytest.raises(TypeError):
        dd.link(1, {PEER: 0, ME: 1}, table)
    with pytest.raises(TypeError):
        dd.link("c", {PEER: 0, ME: 1}, GOOD)
    with pytest.raises(LLMException) as e:  # this engine is not a member
        dd.link("c", {PEER: 0, 7: 1}, table)
    assert e.value.status_code == PI and "cluster id 2" in str(e.value)


def test_link_needs_cache_manager_mode(dd):
    init(dd, cache_manager=False)
    with pytest.raises(LLMException) as e:
        dd.link("comm", {PEER: 0, ME: 1}, json.dumps(GOOD))
    assert e.value.status_code == PI and "cache-manager" in str(e.value)


def test_listener_port_from_device_port_port_or_own_listen_port(dd):
    table = parse_rank_table(edited(lambda d: (d["server_list"][0]["device"][0].pop("device_port"),
                                               d["server_list"][1]["device"][0].pop("device_port"),
                                               d["server_list"][1]["device"][0].update(port="6000"))))
    assert listener_of(table[1], 7000) == ("127.0.0.1", 6000)
    assert listener_of(table[0], 7000) == ("127.0.0.1", 7000)
    with pytest.raises(LLMException) as e:
        listener_of(table[0], None)
    assert "server_list[0].device[0] has no device_port" in str(e.value)
    assert parse_rank_table(edited(lambda d: d.update(version="1.0")))[0].port == 5000
    # No device_port and no listen address of our own: link() names the missing field.
    init(dd)
    with pytest.raises(LLMException) as e:
        dd.link("comm", {PEER: 0, ME: 1},
                edited(lambda d: d["server_list"][0]["device"][0].pop("device_port")))
    assert e.value.status_code == PI and "server_list[0].device[0] has no device_port" in str(e.value)
