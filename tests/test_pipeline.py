# SPDX-License-Identifier: Apache-2.0
"""Pipelined TCP transfers: small asynchronous pulls and pushes to one peer share a data channel,
each request written before the previous reply is read (the server answers a channel's requests in
order). Every transfer of a run still lands in its own blocks only, keeps its own deadline, and
once its handle is done no byte of it moves: also when the peer freezes or dies mid-run."""
import os
import signal
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import TIME_SCALE, cluster, free_port
from peer import pattern
from procs import Peer, read_process_memory, release, wait_dead, wait_stopped

TENSORS, BLOCKS, BB = 2, 128, 64
WAIT_MS = 500
MARGIN_S = 0.3 * TIME_SCALE
SENTINEL = 0xA5


@pytest.fixture
def tcp_pair():
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB,
                wait_ms=WAIT_MS)
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: "tcp",
                   kb.OPTION_SYNC_CACHE_WAIT_TIME: str(WAIT_MS)})
    local = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
    for t in range(TENSORS):
        local.numpy(t)[:] = SENTINEL
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    assert me.link_path(1) == "tcp"
    yield peer, me, local, kb.CacheIndex(1, peer.info["alloc"])
    release(peer, me)


def _blocks(cache, t):
    return cache.numpy(t).reshape(BLOCKS, BB)


def _remote(peer, t):
    raw = read_process_memory(peer.info["pid"], peer.info["addrs"]["alloc"][t], peer.info["tensor_bytes"])
    return np.frombuffer(raw, np.uint8).reshape(BLOCKS, BB)


def test_a_run_of_pulls_and_pushes_lands_each_in_its_own_blocks(tcp_pair):
    peer, me, local, idx = tcp_pair
    for t in range(TENSORS):
        _blocks(local, t)[64:] = pattern(2, t, BLOCKS, BB)[64:]
    hs = []
    for i in range(32):  # interleaved: pull i -> 63 - i, push 64 + i -> 127 - i, different sizes
        hs.append(me.pull_kv_blocks_async(idx, local, [i], [63 - i]))
        src = [64 + i] if i % 2 else [64 + i, 64 + (i + 1) % 32]
        hs.append(me.push_kv_blocks_async(local, idx, src, [127 - i] if i % 2 else [127 - i, 95 - i]))
    kb.wait_all(hs, timeout=10)
    for t in range(TENSORS):
        want, mine = pattern(1, t, BLOCKS, BB), pattern(2, t, BLOCKS, BB)
        got = _blocks(local, t)
        assert np.array_equal(got[63 - np.arange(32)], want[np.arange(32)])
        assert (got[:32] == SENTINEL).all()  # no pull wrote outside its own destination block
        remote = _remote(peer, t)
        for i in range(32):
            assert np.array_equal(remote[127 - i], mine[64 + i]), i
            if i % 2 == 0:
                assert np.array_equal(remote[95 - i], mine[64 + (i + 1) % 32]), i
        assert np.array_equal(remote[:64], want[:64])  # no push wrote outside its destination blocks


def _snapshot(local):
    return [local.numpy(t).copy() for t in range(TENSORS)]


def _submit_and_stop(peer, me, local, idx, sig):
    """Submits 64 one-block pulls, sending `sig` to the peer after the first 8 and waiting until it
    has taken effect; returns the handles and whether a later submission was refused (a dead peer
    can break the link first). A first run opens the channels, so no later transfer waits on a
    handshake (whose timeout would break the link)."""
    kb.wait_all([me.pull_kv_blocks_async(idx, local, [i], [64 + i]) for i in range(64)], timeout=10)
    hs = []
    for i in range(64):
        try:
            hs.append(me.pull_kv_blocks_async(idx, local, [i], [i]))
        except kb.LinkError:
            assert i > 7 and sig == signal.SIGKILL
            return hs, True
        if i == 7:
            os.kill(peer.info["pid"], sig)
            (wait_stopped if sig == signal.SIGSTOP else wait_dead)(peer.info["pid"], 5.0)
    return hs, False


def _wait_every_handle(hs, t0):
    for h in hs:
        try:
            h.wait()
        except (kb.LLMTimeoutError, kb.LinkError):
            pass
    elapsed = time.monotonic() - t0
    assert elapsed <= WAIT_MS / 1000 + MARGIN_S, elapsed
    assert all(h.done() for h in hs)
    return [h.status == kb.Status.LLM_SUCCESS for h in hs]


def _check_successes(local, ok):
    for t in range(TENSORS):
        want = pattern(1, t, BLOCKS, BB)
        for i, good in enumerate(ok):
            if good:
                assert np.array_equal(_blocks(local, t)[i], want[i]), i


def test_a_peer_frozen_mid_run_times_out_by_the_deadline_and_writes_nothing_later(tcp_pair):
    peer, me, local, idx = tcp_pair
    t0 = time.monotonic()
    hs, _ = _submit_and_stop(peer, me, local, idx, signal.SIGSTOP)
    ok = _wait_every_handle(hs, t0)
    assert not all(ok)
    assert any(h.status == kb.Status.LLM_TIMEOUT for h in hs)
    before = _snapshot(local)
    os.kill(peer.info["pid"], signal.SIGCONT)
    time.sleep(0.5)  # a late byte would land now
    for t in range(TENSORS):
        assert np.array_equal(local.numpy(t), before[t])
    _check_successes(local, ok)
    with pytest.raises(kb.LinkError):  # as with the synchronous call, the timeout broke the link
        me.pull_kv_blocks_async(idx, local, [0], [0])


def test_a_peer_killed_mid_run_fails_the_rest_promptly(tcp_pair):
    peer, me, local, idx = tcp_pair
    t0 = time.monotonic()
    hs, refused = _submit_and_stop(peer, me, local, idx, signal.SIGKILL)
    ok = _wait_every_handle(hs, t0)
    assert refused or not all(ok)  # every pull after the death is refused or fails
    assert all(h.status in (kb.Status.LLM_SUCCESS, kb.Status.LLM_LINK_FAILED, kb.Status.LLM_NOT_YET_LINK,
                            kb.Status.LLM_TIMEOUT) for h in hs)
    _check_successes(local, ok)


def test_transfers_after_a_run_reuse_its_channel(tcp_pair):
    peer, me, local, idx = tcp_pair
    for _ in range(3):
        kb.wait_all([me.pull_kv_blocks_async(idx, local, [i], [i]) for i in range(64)], timeout=10)
        me.pull_kv_blocks(idx, local, [5], [6])
    for t in range(TENSORS):
        want = pattern(1, t, BLOCKS, BB)
        assert np.array_equal(_blocks(local, t)[:64][np.arange(64) != 6], want[:64][np.arange(64) != 6])
        assert np.array_equal(_blocks(local, t)[6], want[5])
