# SPDX-License-Identifier: Apache-2.0
"""Spec §5 cases 61-74: PushKvBlocks, run by the Prompt of the §5 fixture.

kvblocks differs from CANN V2 on purpose: a push validates every layer before it copies
anything, so a rejected push (cases 68 and 69) leaves the peer's cache unchanged, where CANN V2
has already written the first layers.
"""
import os
import sys

import numpy as np
import pytest

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_spec_pull import NT, SHAPE, Ext, Spec, expect, make_arrays, register  # noqa: E402

S = kb.Status


@pytest.fixture
def spec():
    s = Spec()
    yield s
    s.close()


def model_push(spec, src, dst, src_tensors=None, dst_tensors=None):
    want = spec.da.copy()
    src_tensors = range(spec.pa.shape[0]) if src_tensors is None else src_tensors
    dst_tensors = range(spec.da.shape[0]) if dst_tensors is None else dst_tensors
    for st, dt in zip(src_tensors, dst_tensors):
        for s, d in zip(src, dst):
            want[dt, d] = spec.pa[st, s]
    return want


def run_push(spec, src, dst, ext=None, src_tensors=None, dst_tensors=None, src_cache=None):
    want = model_push(spec, src, dst, src_tensors, dst_tensors)
    p_before = spec.pa.copy()
    spec.push(src, dst, ext, src_cache=src_cache)
    np.testing.assert_array_equal(spec.da, want)
    np.testing.assert_array_equal(spec.pa, p_before)


def test_case61_push_layer0(spec):
    run_push(spec, [0], [0], Ext((0, 0), (0, 0), 2), range(0, 2), range(0, 2))


def test_case62_default_ext_full_desc(spec):
    # spec.pc carries the full CacheDesc (num_tensors = 10): all 5 layers are pushed.
    run_push(spec, [0, 1], [0, 1])


def test_case62_default_ext_reversed(spec):
    run_push(spec, [0, 1, 2, 3], [3, 2, 1, 0])


def test_case63_default_ext_cache_id_only(spec):
    # Only the cache id (cache_desc.num_tensors == 0): default ranges cannot be resolved.
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0], [0], src_cache=spec.pc.cache_id)
    # With an explicit range the id alone is enough.
    run_push(spec, [1], [2], Ext((1, 1), (1, 1), 2), range(2, 4), range(2, 4), src_cache=spec.pc.cache_id)


def test_case64_host_placement(spec):
    host = make_arrays(NT, SHAPE, +1)
    hc = register(spec.p, host, placement=kb.CachePlacement.HOST)
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0], [0], Ext((0, 0), (0, 0), 2), src_cache=hc)


def test_case65_src_empty(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [], [])
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [], [0])


def test_case65_lengths_differ(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0])
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0], [0, 1])


def test_case66_batch_index_1(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0], [0], idx=kb.CacheIndex(2, spec.dc.cache_id, 1))


def test_case67_widths_differ(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((0, 1), (0, 3), 2))


def test_case67_range_below_minus_one(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((-2, 0), (0, 1), 2))
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((1, 0), (1, 0), 2))


def test_case68_src_layer_out_of_range_atomic(spec):
    # CANN V2 writes remote layer 0 (from local layer 4) before failing on layer 5;
    # kvblocks validates first, so D is unchanged (checked by expect()).
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((4, 5), (0, 1), 2))


def test_case69_dst_layer_out_of_range_atomic(spec):
    # CANN V2 writes remote layer 4 before failing on layer 5; kvblocks leaves D unchanged.
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((0, 1), (4, 5), 2))


@pytest.mark.parametrize("tnpl,tensors", [(1, range(0, 2)), (2, range(0, 4))])
def test_case70_tnpl_ok(spec, tnpl, tensors):
    run_push(spec, [0, 1], [0, 1], Ext((0, 1), (0, 1), tnpl), tensors, tensors)


@pytest.mark.parametrize("tnpl", [7, 17])
def test_case70_tnpl_not_dividing(spec, tnpl):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((0, 1), (0, 1), tnpl))


def test_case70_tnpl_zero(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [0, 1], Ext((0, 1), (0, 1), 0))


def test_case71_dst_block_bounds(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0], [4])
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0, 1], [3, 4])
    run_push(spec, [0], [3])


def test_case71_src_block_bounds(spec):
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [4], [0])
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [2, 4], [0, 1])
    run_push(spec, [3], [0])


def test_case72_dst_cache_unknown(spec):
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.push, [0], [0], idx=kb.CacheIndex(2, spec.dc.cache_id + 100))
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.push, [0], [0], idx=kb.CacheIndex(2, 0))


def test_case72_src_cache_unknown(spec):
    # An explicit range, so the caller-filled num_tensors (0 for a bare id) is not needed.
    expect(spec, S.LLM_KV_CACHE_NOT_EXIST, spec.push, [0], [0], Ext((0, 0), (0, 0), 2),
           src_cache=spec.pc.cache_id + 100)


def test_case73_push_not_linked(spec):
    expect(spec, S.LLM_NOT_YET_LINK, spec.push, [0], [0], idx=kb.CacheIndex(3, spec.dc.cache_id))


def test_case73_push_before_link():
    s = Spec(link=False)
    try:
        expect(s, S.LLM_NOT_YET_LINK, s.push, [0], [0])
    finally:
        s.close()


def test_case74_push_from_decoder_rejected():
    # With kvblocks.RoleCheck=1 (CANN V1 roles, documented) pushes need PROMPT or MIX, as CANN V1
    # for Decoder. CANN V2, the default, has no role checks. Here P is made a DECODER.
    s = Spec(role_p=kb.LlmRole.DECODER, prompt_options={kb.OPTION_ROLE_CHECK: "1"})
    try:
        expect(s, S.LLM_PARAM_INVALID, s.push, [0], [0])
    finally:
        s.close()


def test_case74_push_as_mix_allowed():
    s = Spec(role_p=kb.LlmRole.MIX)
    try:
        run_push(s, [2], [1])
    finally:
        s.close()


def test_case74_any_role_pushes_by_default():
    # CANN V2 (the default): a DECODER pushes, as CANN's switch-roles sample does.
    s = Spec(role_p=kb.LlmRole.DECODER)
    try:
        run_push(s, [2], [1])
    finally:
        s.close()


def test_case74_role_check_disabled():
    s = Spec(role_p=kb.LlmRole.DECODER, prompt_options={kb.OPTION_ROLE_CHECK: "0"})
    try:
        run_push(s, [2], [1])
    finally:
        s.close()


# ---------------------------------------------------------------- further §3.13 rules
def test_push_src_all_dst_single_layer_ignored(spec):
    # Spec §3.13: src {-1,-1} with dst {k,k}: widths equal, dst ignored, layer l -> l.
    run_push(spec, [1], [1], Ext((-1, -1), (3, 3), 2))


def test_push_single_layer_to_other_layer(spec):
    run_push(spec, [0, 3], [1, 2], Ext((1, 1), (3, 3), 2), range(2, 4), range(6, 8))


def test_push_dst_first_minus_one_single_layer(spec):
    # Spec §3.13: src a single layer and dst {-1,-1}: widths are equal but dst layer -1 is invalid.
    expect(spec, S.LLM_PARAM_INVALID, spec.push, [0], [0], Ext((1, 1), (-1, -1), 2))


def test_push_block_bytes_mismatch():
    # [REC] adopted by kvblocks: equal block_bytes on both sides.
    s = Spec(link=False, d_shape=(4, 32))
    try:
        s.link()
        expect(s, S.LLM_PARAM_INVALID, s.push, [0], [0])
    finally:
        s.close()


def test_push_fewer_remote_layers():
    # D has 8 tensors (4 layers): pushing all 5 local layers fails before any copy.
    s = Spec(link=False, d_tensors=8)
    try:
        s.link()
        expect(s, S.LLM_PARAM_INVALID, s.push, [0], [0])
        run_push(s, [0], [1], Ext((1, 4), (0, 3), 2), range(2, 10), range(0, 8))
    finally:
        s.close()


def test_push_timeout():
    # 1 ms for 20 MiB over TCP (0 ms is refused at initialize); the message names the deadline.
    opts = {kb.OPTION_SYNC_CACHE_WAIT_TIME: "1", kb.OPTION_TRANSPORT: "tcp"}
    big = (4, 1 << 18)
    s = Spec(p_shape=big, d_shape=big, prompt_options=opts, decoder_options=opts)
    try:
        with pytest.raises(kb.LLMTimeoutError) as ei:
            s.push([0, 1], [0, 1])
        assert ei.value.status_code == S.LLM_TIMEOUT
        assert "within llm.SyncKvCacheWaitTime=1 ms" in str(ei.value)
    finally:
        s.close()
