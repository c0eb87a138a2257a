# SPDX-License-Identifier: Apache-2.0
"""Metrics (README "Metrics") after known transfers with a real second process: counts, bytes,
statuses, timeouts, link events and histograms hold the values those transfers imply."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import kvblocks as kb
from conftest import cluster, free_port, mix_engine
from procs import Peer, release, wait_stopped
from kvblocks import prometheus as prom

TENSORS, BLOCKS, BB = 4, 16, 4096


def _local(transport="tcp", wait_ms=1000):
    me = mix_engine(2, **{kb.OPTION_TRANSPORT: transport, kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms)})
    return me, me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))


def _peer(m, cid=1):
    return next(p for p in m["peers"] if p["peer"] == cid)


def _kind(peer, path, kind):
    for p in peer["paths"]:
        if p["path"] == path:
            for k in p["kinds"]:
                if k["kind"] == kind:
                    return k
    return None


@pytest.fixture
def linked():
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    me, cache = _local()
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    yield peer, me, cache, port
    release(peer, me)


def test_pulls_and_pushes_count_bytes_and_latency(linked):
    peer, me, cache, _ = linked
    src = kb.CacheIndex(1, peer.info["reg"])
    for i in range(5):
        me.pull_kv_blocks(src, cache, [0, 1, 2], [3, 4, 5])
    me.push_kv_blocks(cache, kb.CacheIndex(1, peer.info["alloc"]), [0, 1], [6, 7])
    h = me.pull_kv_blocks_async(src, cache, [8], [9])
    h.wait()
    m = me.metrics()
    assert m["version"] == 1 and m["cluster_id"] == 2
    assert m["caches"] == 1 and m["cache_bytes"] == TENSORS * BLOCKS * BB
    p = _peer(m)
    assert p["linked"] and p["links"] == 1 and p["relinks"] == 0 and p["data_channels"] >= 1
    path = me.link_path(1)
    assert path == "tcp"
    pull = _kind(p, path, "pull_blocks")
    assert pull["count"] == 5 and pull["status"] == {"success": 5}
    assert pull["bytes"] == 5 * 3 * BB * TENSORS
    assert sum(pull["buckets"]) == 5 and len(pull["buckets"]) == len(m["bucket_bounds"]) + 1
    assert 0 < pull["seconds_sum"] < 5
    push = _kind(p, path, "push_blocks")
    assert push["count"] == 1 and push["bytes"] == 2 * BB * TENSORS
    apull = _kind(p, path, "pull_blocks_async")
    assert apull["count"] == 1 and apull["bytes"] == BB * TENSORS
    tcp = next(x for x in p["paths"] if x["path"] == path)
    assert tcp["bytes_in"] == (15 + 1) * BB * TENSORS and tcp["bytes_out"] == 2 * BB * TENSORS
    assert tcp["in_flight"] == 0
    # The peer's own engine saw an accepted link (it served, it moved nothing itself).
    theirs = peer.call(op="metrics")["metrics"]
    assert _peer(theirs, 2)["links"] == 1 and _peer(theirs, 2)["linked"]
    # The process-wide list has this engine (engines of earlier tests may still exist too).
    ours = [e for e in kb.metrics() if e["cluster_id"] == 2 and any(p["peer"] == 1 for p in e["peers"])]
    assert 5 in [_kind(_peer(e), path, "pull_blocks")["count"] for e in ours if _kind(_peer(e), path, "pull_blocks")]


def test_failures_count_by_status(linked):
    peer, me, cache, _ = linked
    with pytest.raises(kb.CacheNotExistError):
        me.pull_kv_blocks(kb.CacheIndex(1, 999), cache, [0], [0])
    with pytest.raises(kb.LinkError):
        me.pull_kv_blocks(kb.CacheIndex(7, 1), cache, [0], [0])  # no link to cluster 7
    with pytest.raises(kb.ParamInvalidError):
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), cache, [0], [BLOCKS])  # out of range
    me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), cache, [0], [0])
    m = me.metrics()
    p = _peer(m)
    # Failed before a path was chosen: path "none" on the linked peer.
    assert _kind(p, "none", "pull_blocks")["status"] == {"kv_cache_not_exist": 1, "param_invalid": 1}
    assert _kind(p, "none", "pull_blocks")["bytes"] == 0
    assert _kind(p, "tcp", "pull_blocks")["status"] == {"success": 1}
    nolink = next(x for x in m["peers"] if x["peer"] is None)
    assert _kind(nolink, "none", "pull_blocks")["status"] == {"not_yet_link": 1}


def test_timeout_of_a_frozen_peer_is_counted_and_breaks_the_link():
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    me, cache = _local(wait_ms=300)
    try:
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        os.kill(peer.info["pid"], signal.SIGSTOP)
        wait_stopped(peer.info["pid"])
        with pytest.raises(kb.LLMTimeoutError):
            me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), cache, list(range(BLOCKS)), list(range(BLOCKS)))
        p = _peer(me.metrics())
        assert p["timeouts"] == 1 and p["link_breaks"] == 1 and not p["linked"]
        k = _kind(p, "tcp", "pull_blocks")
        assert k["status"] == {"timeout": 1} and k["bytes"] == 0
        assert 0.25 <= k["seconds_sum"] < 2.0  # it waited out llm.SyncKvCacheWaitTime=300 ms
        bounds = me.metrics()["bucket_bounds"]
        landed = [b for b, n in zip(bounds + [float("inf")], k["buckets"]) if n]
        assert len(landed) == 1 and 0.3 <= landed[0] <= 0.6  # the bucket of ~0.3 s
    finally:
        release(peer, me)


def test_link_events_unlink_relink_and_failed_attempt(linked):
    peer, me, cache, port = linked
    assert me.unlink_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    p = _peer(me.metrics())
    assert p["unlinks"] == 1 and not p["linked"] and p["link_breaks"] == 0 and p["data_channels"] == 0
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), cache, [1], [1])
    p = _peer(me.metrics())
    assert p["links"] == 2 and p["relinks"] == 1 and p["linked"]
    assert _kind(p, "tcp", "pull_blocks")["count"] == 1  # a peer's counters survive its relink
    dead = free_port()  # nothing listens there
    assert me.link_llm_clusters([cluster(9, dead)], 500) != [kb.Status.LLM_SUCCESS]
    p9 = _peer(me.metrics(), 9)
    assert p9["link_failures"] == 1 and p9["links"] == 0 and not p9["linked"]
    theirs = _peer(peer.call(op="metrics")["metrics"], 2)
    assert theirs["unlinks"] == 1 and theirs["relinks"] == 1 and theirs["link_breaks"] == 0


def test_same_host_path_is_named_by_the_path():
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="auto", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    me, cache = _local(transport="auto")
    try:
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["alloc"]), cache, [0], [0])
        path = me.link_path(1)
        assert path in ("shm", "cma", "shm+cma")
        p = _peer(me.metrics())
        (used,) = [x for x in p["paths"] if x["kinds"]]
        assert used["path"] in path.split("+") and used["bytes_in"] == BB * TENSORS
    finally:
        release(peer, me)


def test_notifications_are_counted_both_ways():
    port = free_port()
    a = mix_engine(1, port)
    b = mix_engine(2)
    try:
        assert b.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        for i in range(3):
            b.send_notify(1, "n", f"m{i}")
        assert len(a.get_notifies()) == 3
        assert _peer(b.metrics(), 1)["notifies_sent"] == 3
        assert _peer(a.metrics(), 2)["notifies_received"] == 3
        assert {1, 2} <= {e["cluster_id"] for e in kb.metrics()}
    finally:
        b.finalize()
        a.finalize()


def _sample(samples, name, **labels):
    want = tuple(sorted((k, str(v)) for k, v in labels.items()))
    return samples[(name, want)]


def test_prometheus_exposition_of_a_two_process_run(linked):
    peer, me, cache, _ = linked
    for _ in range(4):
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), cache, [0, 1], [0, 1])
    text = prom.exposition()
    s = prom.parse(text)
    lab = dict(engine=2, peer=1, path="tcp", kind="pull_blocks")
    assert _sample(s, "kvblocks_transfers_total", status="success", **lab) == 4
    assert _sample(s, "kvblocks_transfer_seconds_count", **lab) == 4
    assert _sample(s, "kvblocks_transfer_seconds_bucket", le="+Inf", **lab) == 4
    assert _sample(s, "kvblocks_bytes_total", engine=2, peer=1, path="tcp", direction="in") == 4 * 2 * BB * TENSORS
    assert _sample(s, "kvblocks_link_events_total", engine=2, peer=1, event="linked") == 1
    assert _sample(s, "kvblocks_link_up", engine=2, peer=1) == 1
    assert _sample(s, "kvblocks_cache_bytes", engine=2) == TENSORS * BLOCKS * BB
    assert "# TYPE kvblocks_transfer_seconds histogram" in text


def test_prometheus_client_collector_matches():
    pc = pytest.importorskip("prometheus_client")
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    me, cache = _local()
    try:
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), cache, [0, 1, 2], [0, 1, 2])
        reg = pc.CollectorRegistry(auto_describe=False)
        prom.register(reg)
        lab = {"engine": "2", "peer": "1", "path": "tcp", "kind": "pull_blocks"}
        assert reg.get_sample_value("kvblocks_transfers_total", {**lab, "status": "success"}) == 1
        assert reg.get_sample_value("kvblocks_transfer_seconds_count", lab) == 1
        assert reg.get_sample_value("kvblocks_bytes_total", {"engine": "2", "peer": "1", "path": "tcp",
                                                             "direction": "in"}) == 3 * BB * TENSORS
        ours = prom.parse(prom.exposition())
        theirs = prom.parse(pc.generate_latest(reg).decode())
        assert {k: v for k, v in theirs.items() if k[0].startswith("kvblocks_")} == ours
    finally:
        release(peer, me)


def test_serve_metrics_and_stats_cli_read_another_process(linked):
    """The peer process serves its metrics; `kvblocks stats URL` (a third process) prints them."""
    peer, me, cache, _ = linked
    me.push_kv_blocks(cache, kb.CacheIndex(1, peer.info["alloc"]), [0], [0])
    port = peer.call(op="serve_metrics")["port"]
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        s = prom.parse(r.read().decode())
    assert _sample(s, "kvblocks_link_up", engine=1, peer=2) == 1
    assert _sample(s, "kvblocks_caches", engine=1) == 2
    tested = os.path.dirname(os.path.dirname(os.path.abspath(kb.__file__)))  # the kvblocks under test
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tested] + [os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "kvblocks", "stats", url], capture_output=True, text=True,
                         timeout=60, env=env, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "engine 1 peer 2: linked 1" in out.stdout
    mine = subprocess.run([sys.executable, "-m", "kvblocks", "stats", "--serve", "9464"], capture_output=True,
                          text=True, timeout=60, env=env, cwd="/")
    assert mine.returncode == 2 and "kvblocks.serve_metrics(9464)" in mine.stderr
    local = subprocess.run([sys.executable, "-m", "kvblocks", "stats"], capture_output=True, text=True,
                           timeout=60, env=env, cwd="/")
    assert local.returncode == 0 and json.loads(local.stdout) == []


def _kinds_of(engines):
    """{kind: [count, bytes]} over every engine, peer and path."""
    out = {}
    for e in engines:
        for p in e["peers"]:
            for path in p["paths"]:
                for k in path["kinds"]:
                    c = out.setdefault(k["kind"], [0, 0])
                    c[0] += k["count"]
                    c[1] += k["bytes"]
    return out


def test_hixl_reads_writes_and_layerwise_pushes_are_counted():
    import kvblocks.hixl as hx
    from test_hixl_api import Fixture
    before = _kinds_of(kb.metrics())  # engines of earlier tests may still exist in this process
    fx = Fixture()
    try:
        assert fx.c.connect(fx.sname) == hx.SUCCESS
        assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()) == hx.SUCCESS
        assert fx.c.transfer_sync(fx.sname, hx.WRITE, fx.descs(n=512)) == hx.SUCCESS
        kinds = _kinds_of(kb.metrics())
        grown = {k: [a - b for a, b in zip(v, before.get(k, [0, 0]))] for k, v in kinds.items()}
        assert grown["hixl_read"] == [1, 3 * 1024] and grown["hixl_write"] == [1, 3 * 512]
    finally:
        fx.close()
    port = free_port()
    a = mix_engine(1, port, **{kb.OPTION_TRANSPORT: "tcp"})
    b = mix_engine(2, **{kb.OPTION_TRANSPORT: "tcp"})
    try:
        dst = a.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
        src = b.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
        assert b.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        with b.open_layer_push(src, kb.CacheIndex(1, dst.cache_id), [0, 1, 2], [3, 4, 5],
                               tensor_num_per_layer=1) as lp:
            for layer in range(TENSORS):
                lp.layer_ready(layer)
        assert lp.status == kb.Status.LLM_SUCCESS
        k = _kind(_peer(b.metrics(), 1), "tcp", "push_layerwise")
        assert k["count"] == TENSORS and k["bytes"] == TENSORS * 3 * BB and sum(k["buckets"]) == TENSORS
    finally:
        b.finalize()
        a.finalize()


def test_readme_lists_every_metric_family():
    """Contract: README "Metrics"' table names every family the exposition renders (counters with
    their `_total`), and no other: the operator's list cannot drift from the code."""
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    section = readme.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for line in section.splitlines():
        if line.startswith("| `kvblocks_"):
            listed.update(n.strip("` ") for n in line.split("|")[1].split(","))
    rendered = {name + ("_total" if kind == "counter" else "") for name, (kind, _) in prom._HELP.items()}
    assert listed == rendered, (sorted(rendered - listed), sorted(listed - rendered))
