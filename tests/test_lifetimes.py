# SPDX-License-Identifier: Apache-2.0
"""Lifetimes and deadlines: memory is ours again when unregister returns, every path keeps its
deadline, a serving thread cannot pin a cache or a channel, large requests are split, block copies
within one cache do not overlap, allocated tensors are packed."""
import hashlib
import json
import os
import signal
import socket
import struct
import threading
import time
import weakref

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from hostile import WRITE_READY, WRITE_REQ, handshake, open_link, recv_frame, request, send_frame
from procs import Peer, read_process_memory

# 16 tensors x 64 blocks x 256 KiB = 256 MiB per transfer.
T, B, BB = 16, 64, 256 * 1024
DEADLINE_MS = 20
SHORT_MS = 2
# The contract is SyncKvCacheWaitTime + 10 ms on an idle machine; test machines are shared, so the
# check is looser and the measured figure is printed (pytest -s) for the record.
LOAD_MARGIN_S = 0.25


def _engine(cid, wait_ms, listen=None, transport="auto"):
    e = kb.LlmDataDist(cid, kb.LlmRole.MIX)
    opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms), kb.OPTION_TRANSPORT: transport}
    if listen:
        opts[kb.OPTION_LISTEN_IP_INFO] = listen
    e.initialize(opts)
    return e


def _hash_views(views):
    h = hashlib.sha256()
    for v in views:
        h.update(v)
    return h.hexdigest()


def _remote_hash(peer, kind):
    h = hashlib.sha256()
    for a in peer.info["addrs"][kind]:
        h.update(read_process_memory(peer.info["pid"], a, peer.info["tensor_bytes"]))
    return h.hexdigest()


def _freeze(pid):
    """SIGSTOP, and wait until every thread of the process has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(st in "Tt" for st in states):
            return
        time.sleep(0.005)
    raise AssertionError("the peer did not stop")


def _send(peer, **cmd):
    peer.proc.stdin.write((json.dumps(cmd) + "\n").encode())
    peer.proc.stdin.flush()


def _reply(peer):
    return json.loads(peer._readline(60, "to answer"))


# ---------------------------------------------------------------- memory is ours again
@pytest.mark.parametrize("kind", ["registered", "allocated"])
def test_unregister_during_same_host_push_waits_for_it(kind):
    port = free_port()
    me = _engine(2, 5000, listen=f"127.0.0.1:{port}")
    peer = None
    try:
        if kind == "registered":
            arrays = [np.zeros((B, BB), np.uint8) for _ in range(T)]
            cache = me.register_arrays(arrays)
            views = arrays
        else:
            cache = me.allocate_cache(kb.CacheDesc(T, kb.DataType.DT_UINT8, [B, BB]))
            views = [cache.numpy(t) for t in range(T)]
        peer = Peer(1, tensors=T, blocks=B, block_bytes=BB, wait_ms=5000)
        linked = peer.call(op="link", cluster=2, ip="127.0.0.1", port=port)
        assert linked["rets"] == [0] and linked["path"] == ("cma" if kind == "registered" else "shm")
        _send(peer, op="push", cluster=2, remote_cache=cache.cache_id, local="alloc", src=list(range(B)),
              dst=list(range(B)))
        time.sleep(0.003)
        t0 = time.monotonic()
        me.unregister_kv_cache(cache)
        took = time.monotonic() - t0
        after = _hash_views(views)
        time.sleep(0.5)
        assert _hash_views(views) == after, "a peer wrote into the cache after unregister returned"
        reply = _reply(peer)
        print(f"\n{kind}: unregister took {took * 1e3:.1f} ms; push replied {reply}")
        assert reply.get("ok") or reply.get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST
    finally:
        if peer is not None:
            peer.close()
        me.finalize()


def test_unregister_with_a_frozen_same_host_peer_fails_and_keeps_the_cache():
    port = free_port()
    me = _engine(2, 300, listen=f"127.0.0.1:{port}")
    peer = Peer(1, tensors=2, blocks=4, block_bytes=64)
    try:
        arrays = [np.zeros((4, 64), np.uint8) for _ in range(2)]
        ref = weakref.ref(arrays[0])
        cache = me.register_arrays(arrays)
        cid = cache.cache_id
        del cache, arrays
        assert peer.call(op="link", cluster=2, ip="127.0.0.1", port=port)["rets"] == [0]
        _freeze(peer.info["pid"])
        t0 = time.monotonic()
        with pytest.raises(kb.LLMException) as ei:
            me.unregister_kv_cache(cid)
        took = time.monotonic() - t0
        assert ei.value.status_code == kb.Status.LLM_TIMEOUT
        assert "stays registered" in str(ei.value)
        assert took < 0.3 + LOAD_MARGIN_S
        assert ref() is not None, "register_arrays must keep the arrays while the cache is registered"
        os.kill(peer.info["pid"], signal.SIGCONT)
        me.unregister_kv_cache(cid)  # still registered, and the thawed peer answers now
        import gc
        gc.collect()
        assert ref() is None, "the arrays are dropped once unregister succeeds"
    finally:
        os.kill(peer.info["pid"], signal.SIGCONT)
        peer.close()
        me.finalize()


# ---------------------------------------------------------------- every path keeps its deadline
def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
        st = kb.Status.LLM_SUCCESS
    except kb.LLMException as e:
        st = e.status_code
    return st, time.monotonic() - t0


def _check_deadline(path, st, took, dst_hash, wait_ms=DEADLINE_MS):
    before = dst_hash()
    time.sleep(0.2)
    print(f"\n256 MiB over {path}, {wait_ms} ms deadline: {st.name} after {took * 1e3:.1f} ms")
    assert dst_hash() == before, "the destination changed after the call returned"
    assert st in (kb.Status.LLM_TIMEOUT, kb.Status.LLM_SUCCESS)
    assert took <= wait_ms / 1e3 + 0.01 + LOAD_MARGIN_S
    if wait_ms <= SHORT_MS:
        # No path here moves 256 MiB in 2 ms (memcpy over both cores is about 7 ms on an idle machine):
        # a success means the copy never looked at the clock.
        assert st == kb.Status.LLM_TIMEOUT


@pytest.mark.parametrize("pull,wait_ms", [(False, DEADLINE_MS), (True, DEADLINE_MS), (False, SHORT_MS)],
                         ids=["push", "pull", "push-2ms"])
def test_in_process_transfer_keeps_its_deadline(pull, wait_ms):
    port = free_port()
    other = _engine(1, 5000, listen=f"127.0.0.1:{port}")
    me = _engine(2, wait_ms)
    try:
        desc = kb.CacheDesc(T, kb.DataType.DT_UINT8, [B, BB], placement=kb.CachePlacement.DEVICE)
        theirs = other.register_arrays([np.full((B, BB), 7, np.uint8) for _ in range(T)])
        mine = me.register_arrays([np.full((B, BB), 9, np.uint8) for _ in range(T)],
                                  placement=kb.CachePlacement.DEVICE)
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        assert me.link_path(1) == "inprocess"
        idx = kb.CacheIndex(1, theirs.cache_id)
        blocks = list(range(B))
        if pull:
            st, took = _timed(lambda: me.pull_kv_blocks(idx, mine, blocks, blocks))
            dst = mine
        else:
            st, took = _timed(lambda: me.push_kv_blocks(mine, idx, blocks, blocks))
            dst = theirs
        _check_deadline("inprocess " + ("pull" if pull else "push"), st, took,
                        lambda: _hash_views([dst.tensor(t) for t in range(T)]), wait_ms)
    finally:
        me.finalize()
        other.finalize()
        del desc


@pytest.mark.parametrize("wait_ms", [DEADLINE_MS, SHORT_MS])
@pytest.mark.parametrize("path", ["shm", "cma", "tcp"])
def test_push_to_a_peer_process_keeps_its_deadline(path, wait_ms):
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp" if path == "tcp" else "auto", tensors=T, blocks=B,
                block_bytes=BB, wait_ms=5000)
    me = _engine(2, wait_ms, transport="tcp" if path == "tcp" else "auto")
    try:
        mine = me.allocate_cache(kb.CacheDesc(T, kb.DataType.DT_UINT8, [B, BB], placement=kb.CachePlacement.DEVICE))
        for t in range(T):
            mine.numpy(t)[:] = 0xEE
        assert me.link_llm_clusters([cluster(1, port)], 5000) == [kb.Status.LLM_SUCCESS]
        kind = "reg" if path == "cma" else "alloc"
        assert me.link_path(1) in (path, "shm+cma")
        idx = kb.CacheIndex(1, peer.info[kind])
        blocks = list(range(B))
        st, took = _timed(lambda: me.push_kv_blocks(mine, idx, blocks, blocks))
        _check_deadline(path + " push", st, took, lambda: _remote_hash(peer, kind), wait_ms)
    finally:
        me.finalize()
        peer.close()


# ---------------------------------------------------------------- smaller defects
def test_unregister_does_not_wait_behind_a_stalled_serving_thread():
    port = free_port()
    me = _engine(1, 200, listen=f"127.0.0.1:{port}")
    try:
        cache = me.register_arrays([np.zeros((4, 64), np.uint8) for _ in range(2)])
        ctrl, token = open_link(port)
        data, status, _ = handshake(port, 2, 77, token=token)
        assert status == 0
        # A write the peer says may take 10 minutes, whose data never comes.
        send_frame(data, WRITE_REQ, request(cache.cache_id, [0], [(0, 256)], deadline=2**62, budget=600 * 10**9))
        assert recv_frame(data)[0] == WRITE_READY
        st, took = _timed(lambda: me.unregister_kv_cache(cache))
        print(f"\nunregister behind a stalled serving thread: {st.name} after {took * 1e3:.1f} ms")
        assert st == kb.Status.LLM_SUCCESS
        assert took < 0.2 + LOAD_MARGIN_S + 0.5
        data.close()
        ctrl.close()
    finally:
        me.finalize()


def test_a_partial_frame_header_is_dropped_after_the_frame_timeout():
    port = free_port()
    me = _engine(1, 1000, listen=f"127.0.0.1:{port}")
    try:
        ctrl, token = open_link(port)
        data, status, _ = handshake(port, 2, 77, token=token)
        assert status == 0
        data.sendall(b"K")  # one byte of a frame header, then silence
        data.settimeout(30)
        t0 = time.monotonic()
        try:
            while data.recv(4096):
                pass  # an ERROR frame may come first
        except ConnectionError:
            pass
        took = time.monotonic() - t0
        print(f"\npartial frame dropped after {took:.1f} s")
        assert 9.0 < took < 20.0
        data.close()
        ctrl.close()
    finally:
        me.finalize()


def test_a_request_larger_than_one_frame_is_split():
    # 4.2 M non-adjacent one-word blocks: 67 MB of segment list, over the 64 MiB frame limit.
    n = (64 << 20) // 16 + 100_000
    port = free_port()
    p = _engine(1, 60000, listen=f"127.0.0.1:{port}", transport="tcp")
    d = _engine(2, 60000, transport="tcp")
    try:
        src = np.arange(2 * n, dtype=np.uint64).reshape(2 * n, 1)
        theirs = p.register_arrays([src.view(np.uint8)])
        mine = d.allocate_cache(kb.CacheDesc(1, kb.DataType.DT_UINT8, [2 * n, 8]))
        assert d.link_llm_clusters([cluster(1, port)], 5000) == [kb.Status.LLM_SUCCESS]
        assert d.link_path(1) == "tcp"
        blocks = np.arange(0, 2 * n, 2, dtype=np.uint64)
        d.pull_kv_blocks(kb.CacheIndex(1, theirs.cache_id), mine, blocks, blocks)
        got = mine.numpy(0).view(np.uint64).reshape(-1)
        assert np.array_equal(got[0::2], blocks)
        assert not got[1::2].any()
        d.pull_kv_blocks(kb.CacheIndex(1, theirs.cache_id), mine, [1], [1])  # the link still works
        assert mine.numpy(0).view(np.uint64)[1] == 1
    finally:
        d.finalize()
        p.finalize()


def test_copy_kv_blocks_within_one_cache_rejects_overlap():
    dd = _engine(1, 1000)
    try:
        c = dd.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 16], placement=kb.CachePlacement.DEVICE))
        for t in range(2):
            c.numpy(t)[:] = np.arange(8, dtype=np.uint8)[:, None]
        before = [bytes(c.tensor(t)) for t in range(2)]
        with pytest.raises(kb.ParamInvalidError, match="must not overlap"):
            dd.copy_kv_blocks(c, c, [0, 1], [[1, 2]])
        with pytest.raises(kb.ParamInvalidError, match="must not overlap"):
            dd.copy_kv_blocks(c, c, [0], [[3], [0]])
        assert [bytes(c.tensor(t)) for t in range(2)] == before
        dd.copy_kv_blocks(c, c, [0, 1], [[4, 5], [6, 7]])  # disjoint: fine
        assert (c.numpy(0)[[4, 6]] == 0).all() and (c.numpy(1)[[5, 7]] == 1).all()
    finally:
        dd.finalize()


def test_allocated_tensors_are_packed_and_still_map_on_one_host():
    dd = _engine(1, 1000)
    try:
        t0 = time.monotonic()
        tiny = dd.allocate_cache(kb.CacheDesc(1 << 18, kb.DataType.DT_UINT8, [1]))
        took = time.monotonic() - t0
        addrs = tiny.tensor_addrs
        assert addrs[-1] - addrs[0] == (1 << 18) - 1, "one-byte tensors take one byte each"
        print(f"\n2^18 one-byte tensors allocated in {took * 1e3:.0f} ms")
        dd.deallocate_cache(tiny)
        odd = dd.allocate_cache(kb.CacheDesc(3, kb.DataType.DT_FLOAT16, [5, 3]))  # 30 bytes a tensor
        a = odd.tensor_addrs
        assert a[1] - a[0] == 30 and a[0] % 2 == 0
    finally:
        dd.finalize()
    # A same-host peer maps the packed memfd and finds every tensor where the pitch says.
    port = free_port()
    p = _engine(1, 1000, listen=f"127.0.0.1:{port}")
    d = _engine(2, 1000)
    try:
        theirs = p.allocate_cache(kb.CacheDesc(3, kb.DataType.DT_FLOAT16, [5, 3]))
        for t in range(3):
            theirs.numpy(t).view(np.uint8)[:] = np.arange(30, dtype=np.uint8).reshape(5, 6) + 40 * t
        mine = d.allocate_cache(kb.CacheDesc(3, kb.DataType.DT_FLOAT16, [5, 3]))
        assert d.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        assert d.link_path(1) in ("shm", "inprocess")  # a memfd cache is mapped even in-process
        d.pull_kv_blocks(kb.CacheIndex(1, theirs.cache_id), mine, [0, 2, 4], [0, 2, 4])
        for t in range(3):
            assert bytes(mine.tensor(t)) == bytes(theirs.tensor(t))[:6] + bytes(6) + bytes(theirs.tensor(t))[12:18] + \
                bytes(6) + bytes(theirs.tensor(t))[24:30]
    finally:
        d.finalize()
        p.finalize()
