# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: real LlmDataDist pairs linked over loopback TCP."""
import gc

import pytest

import kvblocks as kb
from ports import free_port  # noqa: F401  (tests import it from here)


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
        rets = self.d.link_llm_clusters([cluster(1, self.port)])
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
