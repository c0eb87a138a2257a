# SPDX-License-Identifier: Apache-2.0
"""Asynchronous and batched blocks transfers (pull/push_kv_blocks_async, *_batch, TransferHandle):
correct data on every path (in-process, same host, TCP; real second processes), checks at submission
with the synchronous call's statuses, the deadline counted from submission with a frozen peer, many
transfers in flight across two peers, and waits from other threads."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import TIME_SCALE, cluster, free_port
from peer import pattern
from procs import Peer, read_process_memory, release, wait_stopped

TENSORS, BLOCKS, BB = 4, 64, 64
WAIT_MS = 400
MARGIN_S = 0.2 * TIME_SCALE


def _engine(cluster_id, transport="auto", wait_ms=1000, listen_port=None):
    dd = kb.LlmDataDist(cluster_id, kb.LlmRole.MIX)
    opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport, kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms)}
    if listen_port:
        opts[kb.OPTION_LISTEN_IP_INFO] = f"127.0.0.1:{listen_port}"
    dd.initialize(opts)
    return dd


def _stop(pid):
    """SIGSTOP, then returns once every thread of ``pid`` is stopped (delivery is asynchronous)."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped(pid, 5.0)


# ----------------------------------------------------------------------------- in-process
@pytest.fixture
def inproc():
    port = free_port()
    p, d = _engine(1, listen_port=port), _engine(2)
    desc = kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB])
    pc, dc = p.allocate_cache(desc), d.allocate_cache(desc)
    for t in range(TENSORS):
        pc.numpy(t)[:] = pattern(1, t, BLOCKS, BB)
        dc.numpy(t)[:] = pattern(2, t, BLOCKS, BB)
    assert d.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    assert d.link_path(1) == "inprocess"
    yield p, d, pc, dc
    d.finalize()
    p.finalize()


def _blocks(cache, t):
    return cache.numpy(t).reshape(BLOCKS, BB)


def test_inprocess_pull_and_push_async(inproc):
    p, d, pc, dc = inproc
    h = d.pull_kv_blocks_async(kb.CacheIndex(1, pc.cache_id), dc, [1, 3, 5], [0, 2, 4])
    assert isinstance(h, kb.TransferHandle)
    assert h.wait() is None and h.done() and h.status == kb.Status.LLM_SUCCESS
    for t in range(TENSORS):
        assert np.array_equal(_blocks(dc, t)[[0, 2, 4]], pattern(1, t, BLOCKS, BB)[[1, 3, 5]])
        assert np.array_equal(_blocks(dc, t)[1], pattern(2, t, BLOCKS, BB)[1])
    h = d.push_kv_blocks_async(dc, kb.CacheIndex(1, pc.cache_id), np.array([10, 11], np.uint64), [20, 21],
                               kb.KvCacheExtParam((1, 1), (1, 1), 2))
    h.wait(timeout=10)
    assert np.array_equal(_blocks(pc, 2)[[20, 21]], pattern(2, 2, BLOCKS, BB)[[10, 11]])
    assert np.array_equal(_blocks(pc, 0)[20], pattern(1, 0, BLOCKS, BB)[20])  # layer 0 not selected


def test_bad_arguments_raise_at_submission_like_the_sync_call(inproc):
    p, d, pc, dc = inproc
    before = [dc.numpy(t).copy() for t in range(TENSORS)]
    idx = kb.CacheIndex(1, pc.cache_id)
    cases = [
        (idx, dc, [0], [BLOCKS]),           # local index out of range
        (idx, dc, [BLOCKS + 5], [0]),       # remote index out of range
        (idx, dc, [], []),                  # empty
        (idx, dc, [0, 1], [0]),             # unequal
        (kb.CacheIndex(9, 1), dc, [0], [0]),  # not linked
        (kb.CacheIndex(1, 999), dc, [0], [0]),  # no such remote cache
        (idx, 12345, [0], [0]),             # no such local cache
    ]
    for args in cases:
        with pytest.raises(kb.LLMException) as sync:
            d.pull_kv_blocks(*args)
        with pytest.raises(kb.LLMException) as asy:
            d.pull_kv_blocks_async(*args)
        assert type(asy.value) is type(sync.value) and asy.value.status_code == sync.value.status_code
        assert str(asy.value) == str(sync.value)
    with pytest.raises(TypeError):
        d.pull_kv_blocks_async(idx, dc, [0.5], [0])
    with pytest.raises(ValueError):
        d.push_kv_blocks_async(dc, idx, [-1], [0])
    with pytest.raises(kb.ParamInvalidError) as e:
        d.push_kv_blocks_async(dc, idx, [0], [BLOCKS])
    assert e.value.status_code == kb.Status.LLM_PARAM_INVALID
    for t in range(TENSORS):
        assert np.array_equal(dc.numpy(t), before[t])
    with pytest.raises(TypeError):
        kb.TransferHandle()


def test_batch_tuples_and_dicts_and_all_or_nothing(inproc):
    p, d, pc, dc = inproc
    idx = kb.CacheIndex(1, pc.cache_id)
    reqs = [(idx, dc, [i], [63 - i]) for i in range(8)]
    reqs.append(dict(src_index=idx, dst_cache=dc, src_blocks=[40, 41], dst_blocks=[0, 1],
                     ext_param=kb.KvCacheExtParam((0, 0), (0, 0), 2)))
    hs = d.pull_kv_blocks_batch(reqs)
    assert len(hs) == len(reqs)
    kb.wait_all(hs, timeout=10)
    for t in range(TENSORS):
        for i in range(8):
            assert np.array_equal(_blocks(dc, t)[63 - i], pattern(1, t, BLOCKS, BB)[i])
    assert np.array_equal(_blocks(dc, 1)[[0, 1]], pattern(1, 1, BLOCKS, BB)[[40, 41]])
    assert np.array_equal(_blocks(dc, 2)[0], pattern(2, 2, BLOCKS, BB)[0])  # layer 1 not selected

    # one bad request: it raises with its index and nothing of the batch moves
    before = [dc.numpy(t).copy() for t in range(TENSORS)]
    with pytest.raises(kb.ParamInvalidError, match=r"pull_kv_blocks_batch\[2\]"):
        d.pull_kv_blocks_batch([(idx, dc, [5], [5]), (idx, dc, [6], [6]), (idx, dc, [BLOCKS], [7])])
    with pytest.raises(kb.LinkError, match=r"\[1\]"):
        d.pull_kv_blocks_batch([(idx, dc, [5], [5]), (kb.CacheIndex(7, 1), dc, [6], [6])])
    for t in range(TENSORS):
        assert np.array_equal(dc.numpy(t), before[t])
    with pytest.raises(kb.ParamInvalidError):
        d.pull_kv_blocks_batch([])
    with pytest.raises(TypeError):
        d.pull_kv_blocks_batch([(idx, dc, [1])])
    with pytest.raises(TypeError):
        d.pull_kv_blocks_batch([dict(src_index=idx, dst_cache=dc, src_blocks=[1], dst_blocks=[1], bogus=1)])

    hs = d.push_kv_blocks_batch([(dc, idx, [i], [i]) for i in range(4)] +
                                [dict(src_cache=dc, dst_index=idx, src_blocks=[9], dst_blocks=[10])])
    for h in hs:
        h.wait()
    assert np.array_equal(_blocks(pc, 3)[10], _blocks(dc, 3)[9])


def test_waits_from_other_threads_and_submits_from_many_threads(inproc):
    p, d, pc, dc = inproc
    idx = kb.CacheIndex(1, pc.cache_id)
    errors = []

    def worker(k):
        try:
            hs = [d.pull_kv_blocks_async(idx, dc, [(k * 8 + i) % BLOCKS], [(k * 8 + i) % BLOCKS]) for i in range(8)]
            for h in hs:
                h.wait(5)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    assert not errors
    for t in range(TENSORS):
        assert np.array_equal(_blocks(dc, t), pattern(1, t, BLOCKS, BB))

    # a handle submitted here, waited on elsewhere
    h = d.pull_kv_blocks_async(idx, dc, [0], [1])
    out = []
    th = threading.Thread(target=lambda: out.append(h.wait(5)))
    th.start()
    th.join(10)
    assert out == [None] and h.done()


# ----------------------------------------------------------------------------- other processes
@pytest.fixture(params=["auto", "tcp"])
def linked(request):
    transport = request.param
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport=transport, tensors=TENSORS, blocks=BLOCKS, block_bytes=BB,
                wait_ms=WAIT_MS)
    me = _engine(2, transport, WAIT_MS)
    desc = kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB])
    arrays = [np.zeros((BLOCKS, BB), np.uint8) for _ in range(TENSORS)]
    caches = {"alloc": me.allocate_cache(desc), "reg": me.register_arrays(arrays)}
    for t in range(TENSORS):
        caches["alloc"].numpy(t)[:] = pattern(2, t, BLOCKS, BB)
        arrays[t][:] = pattern(2, t, BLOCKS, BB)
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    assert me.link_path(1) == ("tcp" if transport == "tcp" else "shm+cma")
    yield transport, peer, me, caches, port
    release(peer, me)


@pytest.mark.parametrize("remote", ["alloc", "reg"])
def test_pull_and_push_async_with_another_process(linked, remote):
    _, peer, me, caches, _ = linked
    idx = kb.CacheIndex(1, peer.info[remote])
    dst = caches["reg"]
    hs = [me.pull_kv_blocks_async(idx, dst, [s], [d]) for s, d in [(1, 0), (3, 2), (5, 4), (7, 6)]]
    hs += me.pull_kv_blocks_batch([(idx, caches["alloc"], [9, 10], [30, 31])])
    kb.wait_all(hs, timeout=10)
    for t in range(TENSORS):
        want = pattern(1, t, BLOCKS, BB)
        assert np.array_equal(dst.numpy(t)[[0, 2, 4, 6]], want[[1, 3, 5, 7]])
        assert np.array_equal(dst.numpy(t)[1], pattern(2, t, BLOCKS, BB)[1])
        assert np.array_equal(_blocks(caches["alloc"], t)[[30, 31]], want[[9, 10]])
    h = me.push_kv_blocks_async(caches["alloc"], idx, [0, 1, 2, 3], [63, 62, 61, 60])
    h.wait(10)
    for t in range(TENSORS):
        got = bytes.fromhex(peer.call(op="read", cache=remote, tensor=t)["hex"])
        got = np.frombuffer(got, np.uint8).reshape(BLOCKS, BB)
        assert np.array_equal(got[[63, 62, 61, 60]], pattern(2, t, BLOCKS, BB)[[0, 1, 2, 3]])
        assert np.array_equal(got[59], pattern(1, t, BLOCKS, BB)[59])


def test_64_in_flight_across_two_peers():
    ports = [free_port(), free_port()]
    peers = [Peer(c, listen=f"127.0.0.1:{ports[c // 2]}", transport="tcp", tensors=2, blocks=BLOCKS, block_bytes=BB)
             for c in (1, 3)]
    me = _engine(2, "tcp", 5000)
    try:
        local = me.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [2 * BLOCKS, BB]))
        assert me.link_llm_clusters([cluster(1, ports[0]), cluster(3, ports[1])]) == [kb.Status.LLM_SUCCESS] * 2
        hs = []
        for i in range(64):
            c = 1 if i % 2 == 0 else 3
            hs.append(me.pull_kv_blocks_async(kb.CacheIndex(c, peers[c // 2].info["alloc"]), local, [i], [i]))
        kb.wait_all(hs, timeout=30)
        assert all(h.status == kb.Status.LLM_SUCCESS for h in hs)
        for i in range(64):
            c = 1 if i % 2 == 0 else 3
            for t in range(2):
                assert np.array_equal(local.numpy(t).reshape(-1, BB)[i], pattern(c, t, BLOCKS, BB)[i])
        assert me._link_channels(1) >= 1 and me._link_channels(3) >= 1
    finally:
        me.finalize()
        for p in peers:
            p.close()


def test_deadline_counts_from_submission_with_a_frozen_peer(linked):
    transport, peer, me, caches, _ = linked
    if transport != "tcp":
        pytest.skip("one-sided same-host copies do not need the peer to run")
    dst = caches["alloc"]
    before = [dst.numpy(t).copy() for t in range(TENSORS)]
    _stop(peer.info["pid"])
    t0 = time.monotonic()
    idx = kb.CacheIndex(1, peer.info["alloc"])
    hs = [me.pull_kv_blocks_async(idx, dst, [i], [i]) for i in range(20)]
    hs.append(me.push_kv_blocks_async(dst, idx, [40], [40]))
    h = hs[0]
    # a shorter wait of the caller: the builtin TimeoutError, the transfer stays in flight
    with pytest.raises(TimeoutError) as e:
        h.wait(timeout=0.05)
    assert not isinstance(e.value, kb.LLMTimeoutError)
    assert not h.done() and h.status is None
    # the GIL is released while waiting: this thread keeps running
    ticks = []
    th = threading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.001) for _ in range(50)])
    th.start()
    # The first one submitted times out at its deadline, which breaks the link (as in CANN); the
    # others then end with LLMTimeoutError too, or LinkError when the break came first.
    with pytest.raises(kb.LLMTimeoutError) as e:
        hs[0].wait()
    assert e.value.status_code == kb.Status.LLM_TIMEOUT
    for h in hs[1:]:
        with pytest.raises((kb.LLMTimeoutError, kb.LinkError)):
            h.wait()
    elapsed = time.monotonic() - t0
    th.join()
    assert len(ticks) == 50
    assert WAIT_MS / 1000 - 0.05 <= elapsed <= WAIT_MS / 1000 + MARGIN_S, elapsed
    assert all(h.done() and h.status in (kb.Status.LLM_TIMEOUT, kb.Status.LLM_NOT_YET_LINK, kb.Status.LLM_LINK_FAILED)
               for h in hs)
    remote_before = read_process_memory(peer.info["pid"], peer.info["addrs"]["alloc"][0], peer.info["tensor_bytes"])
    os.kill(peer.info["pid"], signal.SIGCONT)
    time.sleep(0.5)
    for t in range(TENSORS):
        assert np.array_equal(dst.numpy(t), before[t])
    assert read_process_memory(peer.info["pid"], peer.info["addrs"]["alloc"][0],
                               peer.info["tensor_bytes"]) == remote_before
    # as with the synchronous call, a timed-out transfer broke the link
    with pytest.raises(kb.LinkError):
        me.pull_kv_blocks_async(idx, dst, [0], [0])


def test_finalize_completes_in_flight_handles(linked):
    transport, peer, me, caches, _ = linked
    if transport != "tcp":
        pytest.skip("needs a transfer that blocks on the peer")
    _stop(peer.info["pid"])
    idx = kb.CacheIndex(1, peer.info["alloc"])
    hs = [me.pull_kv_blocks_async(idx, caches["alloc"], [i], [i]) for i in range(24)]
    t0 = time.monotonic()
    me.finalize()
    for h in hs:
        with pytest.raises(kb.LLMException):
            h.wait(5)
    assert time.monotonic() - t0 <= WAIT_MS / 1000 + MARGIN_S
