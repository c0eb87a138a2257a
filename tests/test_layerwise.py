# SPDX-License-Identifier: Apache-2.0
"""Layer-wise push (issue 10, part 2): opened once with every check of push_kv_blocks, told layer
by layer, finished under one deadline from the open. The peer is a real second process
(tests/peer.py) over TCP or same-host memory, plus an in-process pair."""
import hashlib
import os
import signal
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from peer import pattern
from procs import Peer, read_process_memory, release, wait_stopped

TENSORS, BLOCKS, BB = 8, 8, 4096  # 4 layers of 2 tensors
LAYERS = TENSORS // 2
WAIT_MS = 400


def _engine(transport, wait_ms=WAIT_MS):
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport,
                   kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms)})
    cache = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
    for t in range(TENSORS):
        cache.numpy(t)[:] = (np.arange(BLOCKS * BB, dtype=np.uint32).reshape(BLOCKS, BB) * 7 + t * 31) % 251
    return me, cache


def _remote(peer, t):
    a = peer.info["addrs"]["alloc"][t]
    return np.frombuffer(read_process_memory(peer.info["pid"], a, peer.info["tensor_bytes"]),
                         np.uint8).reshape(BLOCKS, BB)


def _remote_digest(peer):
    h = hashlib.sha256()
    for t in range(TENSORS):
        h.update(_remote(peer, t).tobytes())
    return h.hexdigest()


@pytest.fixture(params=["tcp", "auto"])
def linked(request):
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport=request.param, tensors=TENSORS, blocks=BLOCKS,
                block_bytes=BB, wait_ms=WAIT_MS)
    me, cache = _engine(request.param)
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    yield peer, me, cache
    release(peer, me)


def _wait_until(cond, timeout_s=5.0):
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.002)


def test_each_ready_layer_lands_while_later_layers_are_not_ready(linked):
    # The key point: layer l is sent as soon as it is ready, not at finish(). Negative control: a
    # LayerReady that only queued (sending from Finish) fails the first wait below.
    peer, me, cache = linked
    src, dst = [1, 3, 4, 5], [6, 0, 1, 2]
    lp = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), src, dst)
    assert lp.num_layers == LAYERS and not lp.done() and lp.status is None
    for layer in range(LAYERS):
        lp.layer_ready(layer)
        _wait_until(lambda: lp.layers_sent == layer + 1)
        for t in range(TENSORS):
            want = cache.numpy(t)[src] if t < 2 * (layer + 1) else pattern(1, t, BLOCKS, BB)[dst]
            assert np.array_equal(_remote(peer, t)[dst], want), (layer, t)
    lp.finish()
    assert lp.done() and lp.status == kb.Status.LLM_SUCCESS
    untouched = [b for b in range(BLOCKS) if b not in dst]
    for t in range(TENSORS):
        assert np.array_equal(_remote(peer, t)[untouched], pattern(1, t, BLOCKS, BB)[untouched])


def test_layers_may_be_made_ready_out_of_order_and_from_a_context_manager(linked):
    peer, me, cache = linked
    with me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), [0, 1], [0, 1]) as lp:
        for layer in (2, 0, 3, 1):
            lp.layer_ready(layer)
    assert lp.status == kb.Status.LLM_SUCCESS and lp.layers_sent == LAYERS
    for t in range(TENSORS):
        assert np.array_equal(_remote(peer, t)[[0, 1]], cache.numpy(t)[[0, 1]])


def _status_of(fn):
    try:
        fn()
    except kb.LLMException as e:
        return type(e), e.status_code
    except (TypeError, ValueError) as e:
        return type(e), None
    return None


def test_open_runs_the_checks_of_push_kv_blocks_with_its_statuses(linked):
    peer, me, cache = linked
    rid = peer.info["alloc"]
    bad = [
        (cache, kb.CacheIndex(1, rid), [], []),                 # empty
        (cache, kb.CacheIndex(1, rid), [0, 1], [0]),            # unequal
        (cache, kb.CacheIndex(1, rid), [0], [BLOCKS]),          # dst out of range
        (cache, kb.CacheIndex(1, rid), [BLOCKS + 3], [0]),      # src out of range
        (cache, kb.CacheIndex(1, 999), [0], [0]),               # unknown remote cache
        (cache, kb.CacheIndex(7, rid), [0], [0]),               # not linked
        (12345, kb.CacheIndex(1, rid), [0], [0]),               # unknown local cache
        (cache, kb.CacheIndex(1, rid), [-1], [0]),              # negative index
    ]
    before = _remote_digest(peer)
    for args in bad:
        got = _status_of(lambda: me.open_layer_push(*args))
        want = _status_of(lambda: me.push_kv_blocks(*args))
        assert got is not None and got == want, (args, got, want)
    # A tensor count the layer size does not divide (8 tensors, 3 per layer), as push_kv_blocks.
    got = _status_of(lambda: me.open_layer_push(cache, kb.CacheIndex(1, rid), [0], [0], tensor_num_per_layer=3))
    want = _status_of(lambda: me.push_kv_blocks(cache, kb.CacheIndex(1, rid), [0], [0],
                                                kb.KvCacheExtParam(tensor_num_per_layer=3)))
    assert got == want == (kb.ParamInvalidError, kb.Status.LLM_PARAM_INVALID)
    with pytest.raises(ValueError):
        me.open_layer_push(cache, kb.CacheIndex(1, rid), [0], [0], tensor_num_per_layer=0)
    assert _remote_digest(peer) == before  # nothing moved


def test_layer_ready_rejects_bad_and_repeated_layers_and_calls_after_finish(linked):
    peer, me, cache = linked
    lp = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), [0], [0], tensor_num_per_layer=4)
    assert lp.num_layers == 2
    with pytest.raises(kb.ParamInvalidError):
        lp.layer_ready(2)
    with pytest.raises(OverflowError):
        lp.layer_ready(-1)
    lp.layer_ready(1)
    with pytest.raises(kb.ParamInvalidError):
        lp.layer_ready(1)
    lp.layer_ready(0)
    lp.finish()
    with pytest.raises(kb.ParamInvalidError):
        lp.layer_ready(0)
    lp.finish()  # finishing again reports the same status


def test_deadline_runs_from_open_and_nothing_lands_after_it(linked):
    # Layers made ready after the deadline (which counts from the open) are not sent. Negative
    # control: a deadline counted from each layer_ready call sends them and fails the digest check.
    peer, me, cache = linked
    before = _remote_digest(peer)
    lp = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), [0, 1], [0, 1])
    time.sleep(WAIT_MS / 1000 + 0.1)
    for layer in range(LAYERS):
        try:
            lp.layer_ready(layer)
        except kb.LLMTimeoutError:
            break
    with pytest.raises(kb.LLMTimeoutError):
        lp.finish()
    assert lp.done() and lp.layers_sent == 0
    time.sleep(0.2)
    assert _remote_digest(peer) == before


def test_finish_times_out_when_layers_never_come_and_the_caller_may_wait_shorter(linked):
    peer, me, cache = linked
    lp = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), [2], [2])
    lp.layer_ready(0)
    with pytest.raises(TimeoutError) as e:  # the builtin: the push is still open
        lp.finish(timeout=0.02)
    assert not isinstance(e.value, kb.LLMException) and not lp.done()
    t0 = time.monotonic()
    with pytest.raises(kb.LLMTimeoutError):
        lp.finish()
    assert time.monotonic() - t0 <= WAIT_MS / 1000 + 0.2
    assert lp.layers_sent == 1  # layer 0 landed; 1..3 were never made ready
    assert np.array_equal(_remote(peer, 1)[2], cache.numpy(1)[2])
    assert np.array_equal(_remote(peer, 2)[2], pattern(1, 2, BLOCKS, BB)[2])


def test_abort_and_dropping_the_handle_send_nothing_more(linked):
    peer, me, cache = linked
    lp = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), [3], [3])
    lp.layer_ready(0)
    lp.drain()
    assert lp.abort() == kb.Status.LLM_FAILED and lp.done() and lp.layers_sent == 1
    with pytest.raises(kb.LLMException):
        lp.layer_ready(1)
    with pytest.raises(kb.LLMException) as e:
        lp.finish()
    assert e.value.status_code == kb.Status.LLM_FAILED
    before = _remote_digest(peer)
    lp2 = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), [4], [4])
    del lp2
    time.sleep(0.1)
    assert _remote_digest(peer) == before


def test_frozen_peer_times_out_and_no_byte_lands_afterwards():
    port = free_port()
    tensors, blocks, bb = 8, 64, 64 * 1024  # 32 MiB a layer: more than the socket buffers hold
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=tensors, blocks=blocks, block_bytes=bb,
                wait_ms=WAIT_MS)
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: "tcp",
                   kb.OPTION_SYNC_CACHE_WAIT_TIME: str(WAIT_MS)})
    try:
        cache = me.allocate_cache(kb.CacheDesc(tensors, kb.DataType.DT_UINT8, [blocks, bb]))
        for t in range(tensors):
            cache.numpy(t)[:] = 0xAB
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        all_blocks = list(range(blocks))
        lp = me.open_layer_push(cache, kb.CacheIndex(1, peer.info["alloc"]), all_blocks, all_blocks)
        os.kill(peer.info["pid"], signal.SIGSTOP)
        wait_stopped(peer.info["pid"])
        for layer in range(tensors // 2):
            lp.layer_ready(layer)
        t0 = time.monotonic()
        with pytest.raises(kb.LLMTimeoutError):
            lp.finish()
        assert time.monotonic() - t0 <= WAIT_MS / 1000 + 0.2
        h = hashlib.sha256()
        for a in peer.info["addrs"]["alloc"]:
            h.update(read_process_memory(peer.info["pid"], a, peer.info["tensor_bytes"]))
        before = h.hexdigest()  # read while the peer is still stopped
        os.kill(peer.info["pid"], signal.SIGCONT)
        time.sleep(1.0)
        h = hashlib.sha256()
        for a in peer.info["addrs"]["alloc"]:
            h.update(read_process_memory(peer.info["pid"], a, peer.info["tensor_bytes"]))
        assert h.hexdigest() == before
    finally:
        release(peer, me)


def test_in_process_pair_and_finalize_with_an_open_push():
    port = free_port()
    p, d = kb.LlmDataDist(1, kb.LlmRole.MIX), kb.LlmDataDist(2, kb.LlmRole.MIX)
    p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
    d.initialize({kb.OPTION_DEVICE_ID: "0"})
    desc = kb.CacheDesc(4, kb.DataType.DT_UINT8, [4, 64])
    src, dst = d.allocate_cache(desc), p.allocate_cache(desc)
    for t in range(4):
        src.numpy(t)[:] = 10 + t
    assert d.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    assert d.link_path(1) == "inprocess"
    lp = d.open_layer_push(src, kb.CacheIndex(1, dst.cache_id), [0], [1])
    lp.layer_ready(0)
    lp.drain()
    assert [int(dst.numpy(t)[1, 0]) for t in range(4)] == [10, 11, 0, 0]
    d.finalize()  # the open push now fails; nothing crashes
    with pytest.raises(kb.LLMException):
        lp.layer_ready(1)
        lp.finish()
    assert [int(dst.numpy(t)[1, 0]) for t in range(4)] == [10, 11, 0, 0]
    p.finalize()
