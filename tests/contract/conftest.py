# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the backend contract suite: the backend parameter and the measured scheduler latency."""
import pytest

from backends import BACKENDS, Scheduler
from ucx_env import ucx_available


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Each backend in turn; ucx only where the kvblocks-ucx plugin is installed, over UCX_TLS=tcp."""
    if request.param == "ucx":
        if not ucx_available():
            pytest.skip("the ucx extra (kvblocks-ucx) is not installed")
        monkeypatch.setenv("UCX_TLS", "tcp")
        monkeypatch.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")
    return request.param


@pytest.fixture(scope="module")
def sched():
    return Scheduler()
