# SPDX-License-Identifier: Apache-2.0
"""The UCX transport in tests: whether the ucx extra is installed, and the UCX_TLS sets it is
tested over. Tests that need it skip (not fail) without it."""
import importlib.util
import os

import pytest

# Both work with UCX's peer error-handling mode (which kvblocks uses): "tcp" alone, and tcp with the
# shared-memory transports (sm = sysv, posix, cma), where UCX keeps only the lanes that detect a
# failed peer. "sm" alone cannot make an endpoint in that mode (test_ucx checks the clear failure).
UCX_TLS_SETS = ["tcp", "tcp,sm"]


def ucx_available() -> bool:
    """True when the kvblocks-ucx plugin (the ucx extra) is installed, as the runtime finds it
    (KVBLOCKS_UCX_PLUGIN: a path, or "off"); imports nothing of UCX."""
    env = os.environ.get("KVBLOCKS_UCX_PLUGIN")
    if env:
        return env != "off" and os.path.exists(env)
    spec = importlib.util.find_spec("kvblocks_ucx")
    return spec is not None and spec.origin is not None and os.path.exists(
        os.path.join(os.path.dirname(spec.origin), "libkvblocks_ucx.so"))


needs_ucx = pytest.mark.skipif(not ucx_available(), reason="the ucx extra (kvblocks-ucx) is not installed")


@pytest.fixture(params=UCX_TLS_SETS)
def ucx_tls(request, monkeypatch):
    """UCX_TLS for this process's engines and every peer process started after it."""
    if not ucx_available():
        pytest.skip("the ucx extra (kvblocks-ucx) is not installed")
    monkeypatch.setenv("UCX_TLS", request.param)
    monkeypatch.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")
    return request.param
