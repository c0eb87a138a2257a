# SPDX-License-Identifier: Apache-2.0
"""Parts of the vLLM connector that need no vLLM engine: the import boundary (the worker side with real kvblocks engines: test_vllm_notices.py)."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.vllm


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_kvblocks_leaves_vllm_and_torch_out():
    code = "import sys, kvblocks, kvblocks.vllm; print('vllm' in sys.modules, 'torch' in sys.modules)"
    assert _run(code) == "False False"


def test_connector_class_loads_on_access():
    """Accessing ``kvblocks.vllm.KvblocksConnector`` gives vLLM's connector class. In this process (vLLM
    is imported here already): a fresh interpreter would spend tens of CPU seconds importing vLLM again,
    and that the import itself leaves vLLM out is the test above."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    except Exception as e:  # noqa: BLE001 - not installed or broken
        pytest.skip(f"vLLM is not importable: {e}")
    import kvblocks.vllm as m
    assert issubclass(m.KvblocksConnector, KVConnectorBase_V1)
    assert m.KvblocksConnector is sys.modules["kvblocks.vllm.connector"].KvblocksConnector
