# SPDX-License-Identifier: Apache-2.0
"""Enum-like ints are checked at the Python boundary: a value the C++ enum does not declare never
reaches the runtime (it would be undefined behaviour there). ValueError names the argument and the
valid values; TypeError for a non-integer."""
import numpy as np
import pytest

import kvblocks as kb
from kvblocks import llm_datadist as ld
from kvblocks.llm_datadist import v2 as ld2

S = kb.Status


@pytest.mark.parametrize("value", [-1, 5, 44, 1000, 2**31, 2**64])
def test_cache_desc_data_type_out_of_range(value):
    with pytest.raises(ValueError, match=rf"data_type={value} is not a valid DataType; valid values: 0-4, 6-41"):
        kb.CacheDesc(1, value, [4, 16])


@pytest.mark.parametrize("value", [-1, 2, 7, 2**32])
def test_cache_desc_placement_out_of_range(value):
    with pytest.raises(ValueError, match=rf"placement={value} is not a valid CachePlacement; "
                                         r"valid values: HOST \(0\), DEVICE \(1\)"):
        kb.CacheDesc(1, kb.DataType.DT_INT8, [4, 16], value)


@pytest.mark.parametrize("value", ["1", 1.0, True, None, object()])
def test_cache_desc_enum_fields_need_integers(value):
    with pytest.raises(TypeError, match="data_type must be a DataType"):
        kb.CacheDesc(1, value, [4, 16])
    with pytest.raises(TypeError, match="placement must be a CachePlacement"):
        kb.CacheDesc(1, kb.DataType.DT_INT8, [4, 16], value)


def test_cache_desc_plain_ints_become_members():
    d = kb.CacheDesc(1, 3, [4, 16], 0)
    assert d.data_type is kb.DataType.DT_INT32 and d.placement is kb.CachePlacement.HOST
    d = kb.CacheDesc(1, np.int64(1), [4, 16], np.uint8(1))  # anything with __index__
    assert d.data_type is kb.DataType.DT_FLOAT16 and d.placement is kb.CachePlacement.DEVICE


def test_cache_desc_assignment_is_checked_too():
    d = kb.CacheDesc(1, kb.DataType.DT_INT8, [4, 16])
    with pytest.raises(ValueError, match="data_type=99"):
        d.data_type = 99
    with pytest.raises(ValueError, match="placement=3"):
        d.placement = 3
    assert d.data_type is kb.DataType.DT_INT8 and d.placement is kb.CachePlacement.DEVICE  # unchanged
    d.data_type = 9
    assert d.data_type is kb.DataType.DT_INT64


def test_values_only_the_cpp_enum_declares_reach_the_runtime():
    # ge::DT_HIFLOAT4 (42) has a size; the DT_MAX sentinel (43) has none and the runtime refuses it.
    dd = kb.LlmDataDist(1, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        assert kb.CacheDesc(1, 42, [4, 16]).tensor_bytes == 32
        dd.deallocate_cache(dd.allocate_cache(kb.CacheDesc(1, 42, [4, 16])))
        with pytest.raises(kb.LLMException) as e:
            dd.allocate_cache(kb.CacheDesc(1, 43, [4, 16]))
        assert e.value.status_code == S.LLM_PARAM_INVALID
    finally:
        dd.finalize()


@pytest.mark.parametrize("value", [0, 5, -1, 2**31, 2**40])
def test_role_out_of_range(value):
    msg = rf"role={value} is not a valid LlmRole; valid values: PROMPT \(1\), DECODER \(2\), MIX \(3\)"
    with pytest.raises(ValueError, match=msg):
        kb.LlmDataDist(1, value)
    dd = kb.LlmDataDist(1, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        with pytest.raises(ValueError, match=msg):
            dd.set_role(value)
        assert dd.role == kb.LlmRole.MIX
    finally:
        dd.finalize()


@pytest.mark.parametrize("value", ["MIX", 3.0, True, None])
def test_role_needs_an_integer(value):
    with pytest.raises(TypeError, match="role must be an LlmRole"):
        kb.LlmDataDist(1, value)


def test_role_kend_reaches_the_runtime():
    # LlmRole::kEnd (4) is declared in C++; Initialize refuses it as CANN does (spec case 8).
    dd = kb.LlmDataDist(1, 4)
    try:
        with pytest.raises(kb.LLMException) as e:
            dd.initialize({kb.OPTION_DEVICE_ID: "0"})
        assert e.value.status_code == S.LLM_PARAM_INVALID
    finally:
        dd.finalize()


def test_add_cache_kind_is_checked():
    dd = kb.LlmDataDist(1, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        for kind in (-1, 3, 255):
            with pytest.raises(ValueError, match=f"kind={kind} is not a cache kind"):
                dd._add_cache(kb.CacheDesc(1, kb.DataType.DT_INT8, [4, 16]), None, kind, -1, None)
    finally:
        dd.finalize()


def test_compat_layer_goes_through_the_same_checks():
    # The llm_datadist layer takes its own enums only (TypeError otherwise, as CANN) and converts
    # them with kvblocks' enums, so nothing unchecked gets through.
    with pytest.raises(TypeError):
        ld2.CacheDesc(1, [4, 16], 99)
    with pytest.raises(TypeError):
        ld2.CacheDesc(1, [4, 16], ld.DataType.DT_INT8, placement=7)
    with pytest.raises(TypeError):
        ld2.LLMDataDist(99, 1)
    for member in ld.DataType:
        assert kb.CacheDesc(1, member, [4, 16]).data_type == int(member)
    for member in ld.Placement:
        assert kb.CacheDesc(1, kb.DataType.DT_INT8, [4, 16], member).placement == int(member)
    kd = ld2.CacheDesc(1, [4, 16], ld.DataType.DT_BF16, ld.Placement.HOST)._to_kb()
    assert kd.data_type is kb.DataType.DT_BF16 and kd.placement is kb.CachePlacement.HOST
