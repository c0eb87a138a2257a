# SPDX-License-Identifier: Apache-2.0
"""Spec §5 cases 4-13: Initialize options, calls before Initialize and after Finalize, and the
APIs that CANN V1 and V2 disable (kvblocks implements all of them)."""
import gc
import os
import signal
import sys
import time

import numpy as np
import pytest

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import cluster, free_port  # noqa: E402
from procs import Peer, wait_stopped  # noqa: E402
from test_spec_pull import NT, SHAPE, Spec, make_arrays, register  # noqa: E402

S = kb.Status
DESC = kb.CacheDesc(NT, kb.DataType.DT_INT32, list(SHAPE))


def status_of(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except kb.LLMException as e:
        return e.status_code
    return S.LLM_SUCCESS


@pytest.fixture
def dd():
    d = kb.LlmDataDist(7, kb.LlmRole.DECODER)
    yield d
    d.finalize()
    del d
    gc.collect()


# ---------------------------------------------------------------- 4-9: Initialize
def test_case4_no_device_id(dd):
    with pytest.raises(kb.ParamInvalidError) as ei:
        dd.initialize({})
    assert ei.value.status_code == S.LLM_PARAM_INVALID


@pytest.mark.parametrize("value", ["", "abc", "-1", "0;1", "1x", " 0"])
def test_case5_bad_device_id(dd, value):
    # "0;1" (several devices) is rejected by CANN V2 as well (spec §3.2 step 3).
    assert status_of(dd.initialize, {kb.OPTION_DEVICE_ID: value}) == S.LLM_PARAM_INVALID


@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:abc", "999.1.1.1:26000", "", ":26000", "127.0.0.1:1:2"])
def test_case6_bad_listen_ip_info(dd, value):
    assert status_of(dd.initialize, {kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: value}) == S.LLM_PARAM_INVALID


def test_case6_listen_ok(dd):
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{free_port()}"})


@pytest.mark.parametrize("value", ["abc", "-5", "", "1.5"])
def test_case7_bad_sync_wait_time(dd, value):
    assert status_of(dd.initialize, {kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: value}) == \
        S.LLM_PARAM_INVALID


def _wait_stopped(pid, timeout=5.0):
    """Returns once every thread of ``pid`` is stopped (SIGSTOP is delivered asynchronously)."""
    wait_stopped(pid, timeout)


def _timed_pull_from_frozen_peer(peer, port, my_cluster, wait_ms):
    """Seconds a pull from the SIGSTOPped ``peer`` takes under ``llm.SyncKvCacheWaitTime`` = wait_ms."""
    me = kb.LlmDataDist(my_cluster, kb.LlmRole.DECODER)
    try:
        me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: "tcp",
                       kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms)})
        cache = me.allocate_cache(kb.CacheDesc(1, kb.DataType.DT_UINT8, [4, 64]))
        assert me.link_llm_clusters([cluster(1, port)]) == [S.LLM_SUCCESS]
        idx = kb.CacheIndex(1, peer.info["reg"])
        me.pull_kv_blocks(idx, cache, [0], [0])  # the link works (and the peer's cache table is fetched)
        os.kill(peer.info["pid"], signal.SIGSTOP)
        try:
            _wait_stopped(peer.info["pid"])
            t0 = time.monotonic()
            st = status_of(me.pull_kv_blocks, idx, cache, [1], [1])
            elapsed = time.monotonic() - t0
        finally:
            os.kill(peer.info["pid"], signal.SIGCONT)
        assert st == S.LLM_TIMEOUT, S(st).name
        return elapsed
    finally:
        me.finalize()


def test_case7_sync_wait_time_ok(dd):
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "3000"})
    # The option is the transfer deadline: a pull from a frozen peer gives up after it, not after the
    # default 1000 ms, and a longer wait takes longer.
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=1, blocks=4, block_bytes=64)
    try:
        short = _timed_pull_from_frozen_peer(peer, port, 2, 200)
        long = _timed_pull_from_frozen_peer(peer, port, 3, 1500)
    finally:
        peer.close()
    assert 0.19 <= short <= 0.2 + 0.5, short
    assert 1.49 <= long <= 1.5 + 0.5, long


def test_case7_transfer_backend_must_be_hixl(dd):
    # Spec §3.2 step 5.
    assert status_of(dd.initialize, {kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSFER_BACKEND: "x"}) == \
        S.LLM_PARAM_INVALID


def test_case8_role_kend():
    d = kb.LlmDataDist(7, 4)  # kEnd
    try:
        assert status_of(d.initialize, {kb.OPTION_DEVICE_ID: "0"}) == S.LLM_PARAM_INVALID
    finally:
        d.finalize()


def test_case9_initialize_twice(dd):
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    # Second call succeeds and ignores its (even invalid) options.
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    dd.initialize({})


# ---------------------------------------------------------------- 10-11: not initialized
def _calls(d, cache_id=1):
    idx = kb.CacheIndex(1, 1)
    return {
        "set_role": lambda: d.set_role(kb.LlmRole.PROMPT),
        "link_llm_clusters": lambda: d.link_llm_clusters([cluster(1, free_port())]),
        "unlink_llm_clusters": lambda: d.unlink_llm_clusters([cluster(1, free_port())]),
        "register_kv_cache": lambda: d.register_kv_cache(DESC, [0x1000] * NT),
        "unregister_kv_cache": lambda: d.unregister_kv_cache(cache_id),
        "allocate_cache": lambda: d.allocate_cache(DESC),
        "deallocate_cache": lambda: d.deallocate_cache(cache_id),
        "pull_kv_blocks": lambda: d.pull_kv_blocks(idx, cache_id, [0], [0]),
        "push_kv_blocks": lambda: d.push_kv_blocks(cache_id, kb.CacheIndex(1, 1), [0], [0]),
        "pull_kv_cache": lambda: d.pull_kv_cache(idx, cache_id),
        "push_kv_cache": lambda: d.push_kv_cache(cache_id, kb.CacheIndex(1, 1)),
        "copy_kv_blocks": lambda: d.copy_kv_blocks(cache_id, cache_id, [0], [[1]]),
        "copy_kv_cache": lambda: d.copy_kv_cache(cache_id, cache_id, 0, 1),
    }


@pytest.mark.parametrize("name", list(_calls(None)))
def test_case10_before_initialize(dd, name):
    assert status_of(_calls(dd)[name]) == S.LLM_FAILED


@pytest.mark.parametrize("name", list(_calls(None)))
def test_case11_after_finalize(name):
    s = Spec()
    try:
        s.d.finalize()
        snap = s.snapshot()
        assert status_of(_calls(s.d, s.dc.cache_id)[name]) == S.LLM_FAILED
        s.assert_unchanged(snap)
    finally:
        s.close()


def test_case11_finalize_twice_and_before_initialize(dd):
    dd.finalize()  # never initialized: no-op
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    dd.finalize()
    dd.finalize()


def test_finalize_then_initialize_again():
    s = Spec()
    try:
        s.pull([1], [0])
        s.p.finalize()
        s.d.finalize()
        port = s.pair.port
        s.p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
        s.d.initialize({kb.OPTION_DEVICE_ID: "0"})
        # Finalize dropped the caches; ids continue (never reused).
        pc = register(s.p, s.pa)
        dc = register(s.d, s.da)
        assert pc.cache_id > s.pc.cache_id and dc.cache_id > s.dc.cache_id
        assert s.d.link_llm_clusters([cluster(1, port)]) == [S.LLM_SUCCESS]
        s.d.pull_kv_blocks(kb.CacheIndex(1, pc.cache_id), dc, [2], [3])
        np.testing.assert_array_equal(s.da[:, 3], s.pa[:, 2])
    finally:
        s.close()


def test_destructor_finalizes():
    port = free_port()
    p = kb.LlmDataDist(1, kb.LlmRole.PROMPT)
    p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
    del p
    gc.collect()
    # The port is free again: a new listener can take it.
    q = kb.LlmDataDist(1, kb.LlmRole.PROMPT)
    try:
        q.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
    finally:
        q.finalize()


# ---------------------------------------------------------------- 12-13: disabled APIs
def test_case12_allocate_and_copy_are_implemented(dd):
    # CANN V2 returns LLM_FEATURE_NOT_ENABLED for AllocateCache / DeallocateCache / CopyKv*;
    # kvblocks implements them with the CANN V1 rules (issue 2 §2).
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    a = dd.allocate_cache(DESC)
    b = dd.allocate_cache(DESC)
    assert 1 <= a.cache_id < b.cache_id
    src, dst = make_arrays(NT, SHAPE, +1), make_arrays(NT, SHAPE, -1)
    for t in range(NT):
        a.numpy(t)[:] = src[t]
        b.numpy(t)[:] = dst[t]
    want = dst.copy()
    dd.copy_kv_blocks(a, b, [0, 2], [[1, 3]])  # block 0 -> 1 and 2 -> 3, every tensor
    want[:, 1], want[:, 3] = src[:, 0], src[:, 2]
    np.testing.assert_array_equal(np.stack([b.numpy(t) for t in range(NT)]), want)
    dd.copy_kv_cache(a, b, 1, 0)  # batch row 1 -> row 0, every tensor
    want[:, 0] = src[:, 1]
    np.testing.assert_array_equal(np.stack([b.numpy(t) for t in range(NT)]), want)
    np.testing.assert_array_equal(np.stack([a.numpy(t) for t in range(NT)]), src)
    dd.deallocate_cache(a)
    dd.deallocate_cache(b.cache_id)


def test_case12_deallocate_unknown_id_succeeds(dd):
    # kvblocks follows the header comment (unknown id -> SUCCESS), not the V1 engine
    # (LLM_KV_CACHE_NOT_EXIST); CANN V2 answers LLM_FEATURE_NOT_ENABLED.
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    dd.deallocate_cache(0)
    dd.deallocate_cache(12345)


def test_case12_before_initialize_is_failed_not_feature_disabled(dd):
    # CANN V2 answers FEATURE_NOT_ENABLED even before Initialize; kvblocks' implemented APIs follow
    # the general rule (LLM_FAILED before Initialize).
    assert status_of(dd.allocate_cache, DESC) == S.LLM_FAILED
    assert status_of(dd.deallocate_cache, 0) == S.LLM_FAILED


def test_case13_register_is_implemented(dd):
    # CANN V1 returns LLM_FEATURE_NOT_ENABLED for RegisterKvCache / UnregisterKvCache; kvblocks
    # implements them (V2 behaviour).
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    arr = make_arrays(NT, SHAPE, +1)
    c = register(dd, arr)
    assert c.cache_id >= 1
    dd.unregister_kv_cache(c)


def test_no_feature_not_enabled_anywhere():
    # Issue 2 §2: no method returns FEATURE_NOT_ENABLED. Exercise each once on a live pair.
    s = Spec(role_p=kb.LlmRole.MIX, role_d=kb.LlmRole.MIX)
    try:
        a = s.d.allocate_cache(kb.CacheDesc(NT, kb.DataType.DT_INT32, list(SHAPE)))
        calls = [
            lambda: s.d.copy_kv_blocks(s.dc, a, [0], [[1]]),
            lambda: s.d.copy_kv_cache(s.dc, a, 0, 0),
            lambda: s.d.pull_kv_cache(kb.CacheIndex(1, s.pc.cache_id), s.dc, 1),
            lambda: s.p.push_kv_cache(s.pc, kb.CacheIndex(2, s.dc.cache_id, 2)),
            lambda: s.d.pull_kv_blocks(kb.CacheIndex(1, s.pc.cache_id), s.dc, [0], [1]),
            lambda: s.p.push_kv_blocks(s.pc, kb.CacheIndex(2, s.dc.cache_id), [0], [1]),
            lambda: s.d.deallocate_cache(a),
        ]
        for c in calls:
            assert status_of(c) == S.LLM_SUCCESS
    finally:
        s.close()
