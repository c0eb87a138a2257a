# SPDX-License-Identifier: Apache-2.0
"""Spec §5 cases 1-3 and §2: status constants, enums, and the status -> exception mapping."""
import pytest

import kvblocks as kb
from kvblocks import _errors

S = kb.Status

# Spec §2 table: name -> value (0x5010B000 + n; LLM_FAILED all ones).
TABLE = {
    "LLM_SUCCESS": 0x0, "LLM_FAILED": 0xFFFFFFFF, "LLM_WAIT_PROC_TIMEOUT": 1, "LLM_KV_CACHE_NOT_EXIST": 2,
    "LLM_REPEAT_REQUEST": 3, "LLM_REQUEST_ALREADY_COMPLETED": 4, "LLM_PARAM_INVALID": 5,
    "LLM_ENGINE_FINALIZED": 6, "LLM_NOT_YET_LINK": 7, "LLM_ALREADY_LINK": 8, "LLM_LINK_FAILED": 9,
    "LLM_UNLINK_FAILED": 10, "LLM_NOTIFY_PROMPT_UNLINK_FAILED": 11, "LLM_CLUSTER_NUM_EXCEED_LIMIT": 12,
    "LLM_PROCESSING_LINK": 13, "LLM_DEVICE_OUT_OF_MEMORY": 14, "LLM_PREFIX_ALREADY_EXIST": 15,
    "LLM_PREFIX_NOT_EXIST": 16, "LLM_SEQ_LEN_OVER_LIMIT": 17, "LLM_NO_FREE_BLOCK": 18,
    "LLM_BLOCKS_OUT_OF_MEMORY": 19, "LLM_CACHE_INCOMPATIBLE": 20, "LLM_CACHE_KEY_ALREADY_EXIST": 21,
    "LLM_COPY_CACHE_FAILED": 22, "LLM_CACHE_ID_ALREADY_EXIST": 23, "LLM_EXIST_LINK": 24,
    "LLM_FEATURE_NOT_ENABLED": 25, "LLM_TIMEOUT": 26, "LLM_LINK_BUSY": 27, "LLM_OUT_OF_MEMORY": 28,
}


def test_case1_constants():
    assert S.LLM_PARAM_INVALID == 0x5010B005 == 1343270917
    assert S.LLM_FAILED == 0xFFFFFFFF
    assert S.LLM_TIMEOUT == 0x5010B01A
    assert S.LLM_EXIST_LINK == 0x5010B018
    assert S.LLM_FEATURE_NOT_ENABLED == 0x5010B019


@pytest.mark.parametrize("name,n", sorted(TABLE.items()))
def test_status_table(name, n):
    want = n if name in ("LLM_SUCCESS", "LLM_FAILED") else 0x5010B000 + n
    assert int(getattr(S, name)) == want


def test_status_table_complete():
    assert {m.name for m in S} == set(TABLE)


def test_case2_status_from_int():
    assert S(1343270917) is S.LLM_PARAM_INVALID
    assert isinstance(S.LLM_PARAM_INVALID, int)
    # kvblocks keeps an unknown code as the raw integer on the exception (the CANN Python layer's
    # "unknown -> LLM_FAILED" mapping belongs to the llm_datadist compatibility package).
    e = kb.LLMException("x", status_code=12345)
    assert e.status_code == 12345
    assert kb.LLMException("x").status_code == S.LLM_FAILED


def test_case3_enums():
    assert (kb.LlmRole.PROMPT, kb.LlmRole.DECODER, kb.LlmRole.MIX) == (1, 2, 3)
    assert (kb.CachePlacement.HOST, kb.CachePlacement.DEVICE) == (0, 1)
    assert kb.DataType.DT_FLOAT16 == 1 and kb.DataType.DT_BF16 == 27 and kb.DataType.DT_INT32 == 3


def test_data_type_numbers():
    # ge numbering, spec §1.1 (5 is reserved).
    want = {"DT_FLOAT": 0, "DT_FLOAT16": 1, "DT_INT8": 2, "DT_INT32": 3, "DT_UINT8": 4, "DT_INT16": 6,
            "DT_UINT16": 7, "DT_UINT32": 8, "DT_INT64": 9, "DT_UINT64": 10, "DT_DOUBLE": 11, "DT_BOOL": 12,
            "DT_STRING": 13, "DT_DUAL_SUB_INT8": 14, "DT_DUAL_SUB_UINT8": 15, "DT_COMPLEX64": 16,
            "DT_COMPLEX128": 17, "DT_QINT8": 18, "DT_QINT16": 19, "DT_QINT32": 20, "DT_QUINT8": 21,
            "DT_QUINT16": 22, "DT_RESOURCE": 23, "DT_STRING_REF": 24, "DT_DUAL": 25, "DT_VARIANT": 26,
            "DT_BF16": 27, "DT_UNDEFINED": 28, "DT_INT4": 29, "DT_UINT1": 30, "DT_INT2": 31, "DT_UINT2": 32,
            "DT_COMPLEX32": 33, "DT_HIFLOAT8": 34, "DT_FLOAT8_E5M2": 35, "DT_FLOAT8_E4M3FN": 36,
            "DT_FLOAT8_E8M0": 37, "DT_FLOAT6_E3M2": 38, "DT_FLOAT6_E2M3": 39, "DT_FLOAT4_E2M1": 40,
            "DT_FLOAT4_E1M2": 41}
    for name, v in want.items():
        assert int(getattr(kb.DataType, name)) == v, name


def test_option_keys():
    # Spec §1.3 (C++ header spellings).
    assert kb.OPTION_LISTEN_IP_INFO == "llm.ListenIpInfo"
    assert kb.OPTION_DEVICE_ID == "llm.DeviceId"
    assert kb.OPTION_SYNC_CACHE_WAIT_TIME == "llm.SyncKvCacheWaitTime"
    assert kb.OPTION_BUF_POOL_CFG == "llm.BufPoolCfg"
    assert kb.OPTION_ENABLE_SET_ROLE == "llm.EnableSwitchRole"
    assert kb.OPTION_LOCAL_COMM_RES == "llm.LocalCommRes"
    assert kb.OPTION_TRANSFER_BACKEND == "llm.TransferBackend"
    assert kb.OPTION_GLOBAL_RESOURCE_CONFIG == "llm.GlobalResourceConfig"


def test_struct_defaults():
    # Spec §1.2 defaults.
    e = kb.KvCacheExtParam()
    assert e.src_layer_range == (-1, -1) and e.dst_layer_range == (-1, -1) and e.tensor_num_per_layer == 2
    d = kb.CacheDesc()
    assert d.num_tensors == 0 and d.data_type == kb.DataType.DT_UNDEFINED and d.placement == kb.CachePlacement.DEVICE
    i = kb.CacheIndex(1, 2)
    assert (i.cluster_id, i.cache_id, i.batch_index) == (1, 2, 0)
    ip = kb.IpInfo("1.2.3.4")
    assert ip.port == 0


def test_ext_param_is_uint8():
    with pytest.raises(ValueError):
        kb.KvCacheExtParam(tensor_num_per_layer=256)
    with pytest.raises(ValueError):
        kb.KvCacheExtParam(tensor_num_per_layer=-1)
    with pytest.raises(TypeError):
        kb.KvCacheExtParam(tensor_num_per_layer=2.0)
    with pytest.raises(TypeError):
        kb.KvCacheExtParam(src_layer_range=range(0, 2))
    assert kb.KvCacheExtParam(tensor_num_per_layer=255).tensor_num_per_layer == 255


CLASSES = {
    S.LLM_PARAM_INVALID: (kb.ParamInvalidError, ValueError),
    S.LLM_KV_CACHE_NOT_EXIST: (kb.CacheNotExistError, LookupError),
    S.LLM_TIMEOUT: (kb.LLMTimeoutError, TimeoutError),
    S.LLM_WAIT_PROC_TIMEOUT: (kb.LLMTimeoutError, TimeoutError),
    S.LLM_NOT_YET_LINK: (kb.LinkError, ConnectionError),
    S.LLM_ALREADY_LINK: (kb.LinkError, ConnectionError),
    S.LLM_LINK_FAILED: (kb.LinkError, ConnectionError),
    S.LLM_UNLINK_FAILED: (kb.LinkError, ConnectionError),
    S.LLM_EXIST_LINK: (kb.LinkError, ConnectionError),
    S.LLM_OUT_OF_MEMORY: (kb.LLMOutOfMemoryError, MemoryError),
    S.LLM_DEVICE_OUT_OF_MEMORY: (kb.LLMOutOfMemoryError, MemoryError),
    S.LLM_FEATURE_NOT_ENABLED: (kb.FeatureNotEnabledError, NotImplementedError),
    S.LLM_FAILED: (kb.LLMException, RuntimeError),
}


@pytest.mark.parametrize("status", list(CLASSES), ids=lambda s: S(s).name)
def test_exception_mapping(status):
    e = _errors.exception_for(status, "op")
    for cls in CLASSES[status]:
        assert isinstance(e, cls)
    assert isinstance(e, kb.LLMException) and isinstance(e, RuntimeError)
    assert e.status_code == status
    assert S(status).name in str(e)


def _header_statuses():
    """``constexpr Status LLM_X = 0x...U;`` from the installed llm_datadist.h, in header order."""
    import os
    import re

    path = os.path.join(kb.get_include(), "llm_datadist", "llm_datadist.h")
    with open(path) as f:
        text = f.read()
    found = re.findall(r"^\s*constexpr\s+Status\s+(LLM_\w+)\s*=\s*(0[xX][0-9A-Fa-f]+|\d+)[uU]?\s*;", text, re.M)
    return [(name, int(v, 0)) for name, v in found]


def test_status_table_matches_cpp_header():
    # The C++ constants and the Python enum are the same table: same names, values and order.
    assert _header_statuses() == [(m.name, int(m)) for m in S]


def test_compat_status_codes_derive_from_the_table():
    # llm_datadist.LLMStatusCode is kvblocks.Status under CANN's Python spellings, less the codes CANN's
    # enum lacks, plus CANN's Python-only codes; a new kvblocks status must be placed in one or the other.
    from kvblocks.llm_datadist import status as ld_status

    renamed = {"LLM_WAIT_PROC_TIMEOUT": "LLM_WAIT_PROCESS_TIMEOUT", "LLM_SEQ_LEN_OVER_LIMIT": "LLM_SEQ_LENOVERLIMIT"}
    python_only = {"LLM_DEVICE_MEM_ERROR": 507053, "LLM_SUSPECT_REMOTE_ERROR": 507057, "LLM_UNKNOWN_ERROR": -1}
    omitted = {"LLM_CACHE_INCOMPATIBLE", "LLM_CACHE_KEY_ALREADY_EXIST", "LLM_COPY_CACHE_FAILED",
               "LLM_CACHE_ID_ALREADY_EXIST"}
    assert {m.name for m in ld_status._NOT_IN_CANN_PYTHON} == omitted
    want = [(renamed.get(m.name, m.name), int(m)) for m in S if m.name not in omitted] + list(python_only.items())
    assert [(m.name, int(m)) for m in ld_status.LLMStatusCode] == want
    assert not set(ld_status.LLMStatusCode.__members__) - {n for n, _ in want}  # no aliases either


def test_status_enums_are_typed_for_mypy(tmp_path):
    # kvblocks ships no stub for the status table: mypy --strict must see the members from the .py files.
    pytest.importorskip("mypy")
    import subprocess
    import sys

    code = ("import kvblocks as kb\nfrom kvblocks.llm_datadist import LLMStatusCode\n"
            "a: kb.Status = kb.Status.LLM_SEQ_LEN_OVER_LIMIT\nb: LLMStatusCode = LLMStatusCode.LLM_SEQ_LENOVERLIMIT\n"
            "c: int = a.value + b.value\nd: kb.LLMException = kb._errors.exception_for(a, 'op', 'detail')\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", "/dev/null",
                        "--python-executable", sys.executable, "-c", code],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
