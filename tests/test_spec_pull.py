# SPDX-License-Identifier: Apache-2.0
"""Spec §5 cases 33-60: PullKvBlocks, run by the Decoder of the §5 fixture.

Fixture (spec §5): P = cluster 1, PROMPT, listening on loopback; D = cluster 2, DECODER; each
registers one cache of 10 tensors INT32 [4, 16] (4 blocks of 64 B, 5 layers at tnpl 2) before D
links to P. Every rejected call must leave both caches unchanged (kvblocks validates everything
before the first byte moves).
"""
import os
import sys
from array import array

import numpy as np
import pytest

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pair, cluster  # noqa: E402

S = kb.Status
NT = 10
SHAPE = (4, 16)
Ext = kb.KvCacheExtParam


def make_arrays(num_tensors, shape, sign, dtype=np.int32):
    """Distinct values per (tensor, block, element); P positive, D negative."""
    n = int(np.prod(shape))
    base = np.arange(num_tensors * n, dtype=np.int64).reshape((num_tensors,) + tuple(shape))
    if sign > 0:
        return (1_000_000 + base).astype(dtype)
    return (-1 - base).astype(dtype)


def register(dd, arr, data_type=kb.DataType.DT_INT32, placement=kb.CachePlacement.DEVICE):
    """RegisterKvCache over the tensors of one contiguous ndarray (axis 0 = tensor)."""
    desc = kb.CacheDesc(arr.shape[0], data_type, list(arr.shape[1:]), placement)
    return dd.register_kv_cache(desc, [arr[t].ctypes.data for t in range(arr.shape[0])])


class Spec:
    """The §5 fixture. ``pa``/``da`` are the P/D cache contents as (tensor, block, elem) arrays."""

    def __init__(self, link=True, p_tensors=NT, d_tensors=NT, p_shape=SHAPE, d_shape=SHAPE, **pair_kw):
        self.pair = Pair(**pair_kw)
        self.p, self.d = self.pair.p, self.pair.d
        self.pa = make_arrays(p_tensors, p_shape, +1)
        self.da = make_arrays(d_tensors, d_shape, -1)
        self.pc = register(self.p, self.pa)
        self.dc = register(self.d, self.da)
        self.linked = False
        if link:
            self.link()

    def link(self):
        self.pair.link()
        self.linked = True

    # D pulls from P / P pushes to D, with the §5 cache ids.
    def pull(self, src, dst, ext=None, idx=None, dst_cache=None):
        idx = kb.CacheIndex(1, self.pc.cache_id) if idx is None else idx
        self.d.pull_kv_blocks(idx, self.dc if dst_cache is None else dst_cache, src, dst, ext)

    def push(self, src, dst, ext=None, idx=None, src_cache=None):
        idx = kb.CacheIndex(2, self.dc.cache_id) if idx is None else idx
        self.p.push_kv_blocks(self.pc if src_cache is None else src_cache, idx, src, dst, ext)

    def snapshot(self):
        return self.pa.copy(), self.da.copy()

    def assert_unchanged(self, snap):
        np.testing.assert_array_equal(self.pa, snap[0])
        np.testing.assert_array_equal(self.da, snap[1])

    def close(self):
        self.pair.close()


def expect(spec, status, fn, *args, **kwargs):
    """``fn`` raises LLMException with ``status``, and neither cache changed."""
    snap = spec.snapshot()
    with pytest.raises(kb.LLMException) as ei:
        fn(*args, **kwargs)
    assert ei.value.status_code == status, f"{S(ei.value.status_code).name} != {S(status).name}"
    spec.assert_unchanged(snap)
    return ei.value


def model_pull(spec, src, dst, src_tensors=None, dst_tensors=None):
    """Expected D contents after a pull (pure numpy)."""
    want = spec.da.copy()
    src_tensors = range(spec.pa.shape[0]) if src_tensors is None else src_tensors
    dst_tensors = range(spec.da.shape[0]) if dst_tensors is None else dst_tensors
    for st, dt in zip(src_tensors, dst_tensors):
        for s, d in zip(src, dst):
            want[dt, d] = spec.pa[st, s]
    return want


@pytest.fixture
def spec():
    s = Spec()
    yield s
    s.close()


def run_pull(spec, src, dst, ext=None, src_tensors=None, dst_tensors=None):
    want = model_pull(spec, src, dst, src_tensors, dst_tensors)
    p_before = spec.pa.copy()
    spec.pull(src, dst, ext)
    np.testing.assert_array_equal(spec.da, want)
    np.testing.assert_array_equal(spec.pa, p_before)


# ---------------------------------------------------------------- 33-35: data placement
def test_case33_pull_blocks_0_1(spec):
    before = spec.da.copy()
    spec.pull([0, 1], [0, 1])
    np.testing.assert_array_equal(spec.da[:, 0:2], spec.pa[:, 0:2])
    np.testing.assert_array_equal(spec.da[:, 2:4], before[:, 2:4])


def test_case34_pull_1_3_to_0_2(spec):
    run_pull(spec, [1, 3], [0, 2])


def test_case35_pull_reversed(spec):
    run_pull(spec, [0, 1, 2, 3], [3, 2, 1, 0])
    np.testing.assert_array_equal(spec.da[:, ::-1], spec.pa)


# ---------------------------------------------------------------- 36-40: block-list validation
def test_case36_batch_index_1(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0], [0], idx=kb.CacheIndex(1, spec.pc.cache_id, 1))


@pytest.mark.parametrize("dst", [[], [0]], ids=["dst_empty", "dst_0"])
def test_case37_src_empty(spec, dst):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [], dst)


def test_case38_lengths_differ(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0])


def test_case39_dst_block_bounds(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0], [4])
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [3, 4])
    run_pull(spec, [0], [3])


def test_case40_src_block_bounds(spec):
    # [REC] adopted by kvblocks: every src index >= remote num_blocks is rejected.
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [4], [0])
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [3, 4], [0, 1])
    run_pull(spec, [3], [0])


# ---------------------------------------------------------------- 41-42: duplicates
def test_case41_duplicate_dst(spec):
    before = spec.da.copy()
    spec.pull([0, 1], [2, 2])
    for t in range(NT):
        assert (np.array_equal(spec.da[t, 2], spec.pa[t, 0]) or np.array_equal(spec.da[t, 2], spec.pa[t, 1]))
    np.testing.assert_array_equal(spec.da[:, [0, 1, 3]], before[:, [0, 1, 3]])


def test_case42_duplicate_src(spec):
    run_pull(spec, [0, 0], [1, 2])
    np.testing.assert_array_equal(spec.da[:, 1], spec.pa[:, 0])
    np.testing.assert_array_equal(spec.da[:, 2], spec.pa[:, 0])


# ---------------------------------------------------------------- 43-46: identities
def test_case43_not_linked_cluster(spec):
    expect(spec, S.LLM_NOT_YET_LINK, spec.pull, [0], [0], idx=kb.CacheIndex(3, spec.pc.cache_id))


def test_case43_before_link():
    s = Spec(link=False)
    try:
        expect(s, S.LLM_NOT_YET_LINK, s.pull, [0], [0])
    finally:
        s.close()


def test_case44_own_cluster(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0], [0], idx=kb.CacheIndex(2, spec.pc.cache_id))


def test_case45_dst_cache_not_registered(spec):
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.pull, [0], [0], dst_cache=spec.dc.cache_id + 100)


def test_case46_src_cache_not_registered(spec):
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.pull, [0], [0], idx=kb.CacheIndex(1, spec.pc.cache_id + 100))
    # Lookup by cache_id only when cache_id > 0 (spec §1.6): 0 and negative ids are never found.
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.pull, [0], [0], idx=kb.CacheIndex(1, 0))
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.pull, [0], [0], idx=kb.CacheIndex(1, -1))


def test_case45_46_error_types(spec):
    e = expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.pull, [0], [0], dst_cache=99)
    assert isinstance(e, kb.CacheNotExistError) and isinstance(e, LookupError)
    e = expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0], [4])
    assert isinstance(e, kb.ParamInvalidError) and isinstance(e, ValueError)
    e = expect(spec, S.LLM_NOT_YET_LINK, spec.pull, [0], [0], idx=kb.CacheIndex(3, 1))
    assert isinstance(e, kb.LinkError) and isinstance(e, ConnectionError)


# ---------------------------------------------------------------- 47-56: layer ranges
def test_case47_tnpl_zero(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((-1, -1), (-1, -1), 0))
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((0, 1), (0, 1), 0))


def test_case48_range_below_minus_one(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((-2, 1), (0, 1), 2))
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((0, 1), (0, -2), 2))


def test_case49_first_after_second(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((1, 0), (1, 0), 2))


def test_case50_range_0_1(spec):
    run_pull(spec, [0, 1], [0, 1], Ext((0, 1), (0, 1), 2), range(0, 4), range(0, 4))


def test_case50_range_0_1_tnpl1(spec):
    run_pull(spec, [0, 1], [0, 1], Ext((0, 1), (0, 1), 1), range(0, 2), range(0, 2))


@pytest.mark.parametrize("tnpl", [7, 17])
def test_case51_tnpl_not_dividing(spec, tnpl):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((0, 1), (0, 1), tnpl))


def test_case52_widths_differ(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((0, 1), (0, 2), 2))


def test_case53_last_layer(spec):
    run_pull(spec, [0, 1], [0, 1], Ext((4, 4), (4, 4), 2), range(8, 10), range(8, 10))
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0, 1], [0, 1], Ext((5, 5), (5, 5), 2))


def test_case53_src_layer_past_remote(spec):
    # [REC] (spec §3.11 step 16): a src range past the remote tensors is LLM_PARAM_INVALID.
    expect(spec, S.LLM_PARAM_INVALID, spec.pull, [0], [0], Ext((5, 5), (4, 4), 2))


def test_case54_shifted_layers(spec):
    run_pull(spec, [0, 1, 2, 3], [0, 1, 2, 3], Ext((2, 3), (0, 1), 2), range(4, 8), range(0, 4))


def test_case55_default_range_tnpl3(spec):
    run_pull(spec, [1, 2], [2, 1], Ext((-1, -1), (-1, -1), 3))


def test_case56_dst_range_default_pulls_all(spec):
    run_pull(spec, [0, 2], [1, 3], Ext((0, 1), (-1, -1), 2))


def test_case56_minus_one_first_means_all(spec):
    # Spec §1.5: {-1, 3} passes validation and is treated as "all layers".
    run_pull(spec, [3], [0], Ext((-1, 3), (-1, 3), 2))


# ---------------------------------------------------------------- 57-60
def test_case57_tensor_count_mismatch():
    s = Spec(link=False, d_tensors=8)
    try:
        s.link()
        expect(s, S.LLM_PARAM_INVALID, s.pull, [0], [0])
        # An explicit range that fits both sides is fine.
        run_pull(s, [0], [1], Ext((1, 3), (0, 2), 2), range(2, 8), range(0, 6))
    finally:
        s.close()


def test_case57b_block_bytes_mismatch():
    # [REC] adopted by kvblocks: local and remote block_bytes must be equal.
    s = Spec(link=False, d_shape=(4, 8))
    try:
        s.link()
        expect(s, S.LLM_PARAM_INVALID, s.pull, [0], [0])
    finally:
        s.close()


def test_case58_cache_registered_after_link(spec):
    # kvblocks (issue 31) asks the peer for a cache its link-time table lacks, once, as CANN looks a
    # remote cache up at transfer time: a cache registered after linking is pulled from. (Spec
    # case 58 -- a cache registered after the first transfer is invisible in CANN -- is not copied:
    # kvblocks finds it too.) An id the peer never registered is still LLM_KV_CACHE_NOT_EXIST.
    late = make_arrays(NT, SHAPE, +1) + 7
    lc = register(spec.p, late)
    before = spec.da.copy()
    spec.pull([1, 2], [0, 3], idx=kb.CacheIndex(1, lc.cache_id))
    np.testing.assert_array_equal(spec.da[:, 0], late[:, 1])
    np.testing.assert_array_equal(spec.da[:, 3], late[:, 2])
    np.testing.assert_array_equal(spec.da[:, 1:3], before[:, 1:3])
    e = expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.pull, [0], [0], idx=kb.CacheIndex(1, lc.cache_id + 100))
    assert "as of linking" not in str(e)
    # The caches of the link-time table still work.
    run_pull(spec, [0], [0])


def test_case59_timeout():
    # A 1 ms deadline for 20 MiB on the TCP path cannot be met (0 ms is refused at initialize). After
    # a timeout the link is unusable (CANN: re-link to recover). The message names the deadline and
    # its option.
    opts = {kb.OPTION_SYNC_CACHE_WAIT_TIME: "1", kb.OPTION_TRANSPORT: "tcp"}
    big = (4, 1 << 18)  # 1 MiB blocks
    s = Spec(p_shape=big, d_shape=big, prompt_options=opts, decoder_options=opts)
    try:
        with pytest.raises(kb.LLMTimeoutError) as ei:
            s.pull([0, 1], [0, 1])
        assert ei.value.status_code == S.LLM_TIMEOUT
        assert isinstance(ei.value, TimeoutError)
        assert "within llm.SyncKvCacheWaitTime=1 ms" in str(ei.value)
        expect(s, S.LLM_NOT_YET_LINK, s.pull, [0], [0])
    finally:
        s.close()


@pytest.mark.parametrize("role", [kb.LlmRole.PROMPT])
def test_case60_pull_role_rejected(role):
    # With kvblocks.RoleCheck=1 (CANN V1 roles, documented) pulls need DECODER or MIX, like CANN V1
    # for Prompt. CANN V2, the default, has no role checks.
    s = Spec(role_d=role, decoder_options={kb.OPTION_ROLE_CHECK: "1"})
    try:
        expect(s, S.LLM_PARAM_INVALID, s.pull, [0], [0])
    finally:
        s.close()


def test_case60_pull_as_mix_allowed():
    # kvblocks allows MIX to pull (CANN V1 rejects kMix; V2 allows every role).
    s = Spec(role_d=kb.LlmRole.MIX)
    try:
        run_pull(s, [1], [2])
    finally:
        s.close()


def test_case60_any_role_pulls_by_default():
    # CANN V2 (the default): pulls do not depend on the role ("与角色无关"); a PROMPT pulls.
    s = Spec(role_d=kb.LlmRole.PROMPT)
    try:
        run_pull(s, [1], [2])
    finally:
        s.close()


def test_case60_role_check_disabled():
    # Option kvblocks.RoleCheck = "0" (the default) is CANN V2 behaviour: any role may pull.
    s = Spec(role_d=kb.LlmRole.PROMPT, decoder_options={kb.OPTION_ROLE_CHECK: "0"})
    try:
        run_pull(s, [1], [2])
    finally:
        s.close()


# ---------------------------------------------------------------- Python-only argument forms
@pytest.mark.parametrize("make", [list, tuple, lambda v: array("Q", v), lambda v: np.array(v, dtype=np.int64),
                                  lambda v: np.array(v, dtype=np.uint32), lambda v: np.array(v, dtype=np.int16)],
                         ids=["list", "tuple", "array_Q", "np_int64", "np_uint32", "np_int16"])
def test_block_list_forms(spec, make):
    run_pull(spec, make([1, 3]), make([0, 2]))


@pytest.mark.parametrize("bad,exc", [([-1], ValueError), ([1.0], TypeError), (["1"], TypeError),
                                     (np.array([-1]), ValueError), (np.array([1.0]), TypeError), ("01", TypeError),
                                     (5, TypeError)])
def test_block_list_rejected_before_call(spec, bad, exc):
    snap = spec.snapshot()
    with pytest.raises(exc):
        spec.pull(bad, [0])
    with pytest.raises(exc):
        spec.pull([0], bad)
    spec.assert_unchanged(snap)
