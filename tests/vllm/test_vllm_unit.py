# SPDX-License-Identifier: Apache-2.0
"""Parts of the vLLM connector that need no vLLM: the import boundary and the side channel."""
import os
import subprocess
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kvblocks.vllm._sidechannel import SideChannelClient, SideChannelServer  # noqa: E402

pytestmark = pytest.mark.vllm


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_kvblocks_leaves_vllm_and_torch_out():
    code = "import sys, kvblocks, kvblocks.vllm; print('vllm' in sys.modules, 'torch' in sys.modules)"
    assert _run(code) == "False False"


def test_connector_class_loads_on_access():
    try:
        import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401  (a bare "vllm" could be this folder)
    except Exception as e:  # noqa: BLE001 - not installed or broken
        pytest.skip(f"vLLM is not importable: {e}")
    code = ("import kvblocks.vllm as m; from vllm.distributed.kv_transfer.kv_connector.v1.base import "
            "KVConnectorBase_V1 as B; print(issubclass(m.KvblocksConnector, B))")
    assert _run(code).splitlines()[-1] == "True"


def _server(token=None):
    done = []
    ev = threading.Event()

    def on_done(r):
        done.append(r)
        ev.set()

    srv = SideChannelServer("127.0.0.1", 0, lambda: {"cache_id": 1}, on_done, token)
    return srv, done, ev


def test_hello_and_done():
    srv, done, ev = _server()
    c = SideChannelClient("127.0.0.1", srv.port)
    try:
        assert c.call({"op": "hello"})["cache_id"] == 1
        c.call({"op": "done", "req": "r1"})
        assert ev.wait(5) and done == ["r1"]
    finally:
        c.close()
        srv.close()


def test_auth_token_required_and_checked():
    srv, done, _ = _server("s3cret")
    good = SideChannelClient("127.0.0.1", srv.port, "s3cret")
    bad = SideChannelClient("127.0.0.1", srv.port, "wrong", timeout_s=2)
    none = SideChannelClient("127.0.0.1", srv.port, None, timeout_s=2)
    try:
        assert good.call({"op": "hello"})["cache_id"] == 1
        with pytest.raises((ConnectionError, OSError)):
            bad.call({"op": "done", "req": "x"})
        with pytest.raises((ConnectionError, OSError, ValueError)):
            none.call({"op": "done", "req": "y"})  # taken as a wrong auth line: connection closed
        assert done == []
    finally:
        for c in (good, bad, none):
            c.close()
        srv.close()


def test_unreachable_peer_fails_fast():
    srv, _, _ = _server()
    port = srv.port
    srv.close()
    c = SideChannelClient("127.0.0.1", port, timeout_s=1)
    with pytest.raises(OSError):
        c.call({"op": "hello"})
