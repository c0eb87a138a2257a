# SPDX-License-Identifier: Apache-2.0
"""Two "hosts": a Prompt and a Decoder in separate network namespaces joined by a veth pair.
Different network namespaces mean different hosts to kvblocks, so data goes over TCP, or over UCX
when both sides have the ucx extra and kvblocks.UcxTrustedNetwork=1 (auto picks it for other hosts;
Transport=ucx forces it)."""

import numpy as np
import pytest

from netns import two_hosts  # noqa: F401  (a fixture)
from peer import pattern
from procs import Peer
from ucx_env import UCX_TLS_SETS, ucx_available

TENSORS, BLOCKS, BB = 4, 16, 4096


# (transport, UCX_TLS or "no-ucx-prompt": the prompt runs without UCX, so auto must keep tcp, and
# whether both set kvblocks.UcxTrustedNetwork=1: without it auto never uses UCX)
CASES = ([("auto", None, False), ("auto", None, True), ("tcp", None, False), ("auto", "no-ucx-prompt", True)] +
         [("ucx", tls, True) for tls in UCX_TLS_SETS])
TRUSTED = {"kvblocks.UcxTrustedNetwork": "1"}


IDS = [(t if tls is None else f"{t}-{tls}") + ("-trusted" if tr else "") for t, tls, tr in CASES]


@pytest.mark.parametrize("transport,tls,trusted", CASES, ids=IDS)
def test_pull_and_push_between_two_hosts(two_hosts, transport, tls, trusted, monkeypatch):
    ns_a, ns_b, subnet = two_hosts
    if (transport == "ucx" or tls == "no-ucx-prompt") and not ucx_available():
        pytest.skip("the ucx extra (kvblocks-ucx) is not installed")
    if tls == "no-ucx-prompt":
        monkeypatch.setenv("KVBLOCKS_UCX_PLUGIN", "off")  # for the prompt only, undone below
    elif tls is not None:
        monkeypatch.setenv("UCX_TLS", tls)
    expect = "ucx" if transport == "ucx" or (transport == "auto" and trusted and ucx_available()) else "tcp"
    options = TRUSTED if trusted else None
    prompt = Peer(1, listen=f"{subnet}.1:26555", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB,
                  prefix=("ip", "netns", "exec", ns_a), role="PROMPT", transport=transport, options=options)
    if tls == "no-ucx-prompt":
        monkeypatch.delenv("KVBLOCKS_UCX_PLUGIN")
        expect = "tcp"
    decoder = Peer(2, tensors=TENSORS, blocks=BLOCKS, block_bytes=BB, prefix=("ip", "netns", "exec", ns_b),
                   role="MIX", transport=transport, options=options)
    try:
        r = decoder.call(op="link", cluster=1, ip=f"{subnet}.1", port=26555)
        assert r == {"rets": [0], "path": expect}
        assert decoder.call(op="pull", cluster=1, remote_cache=prompt.info["reg"], local="alloc",
                            src=[1, 3, 5, 7], dst=[0, 2, 4, 6]) == {"ok": True}
        for t in range(TENSORS):
            got = decoder.read("alloc", t).reshape(BLOCKS, BB)
            assert np.array_equal(got[[0, 2, 4, 6]], pattern(1, t, BLOCKS, BB)[[1, 3, 5, 7]])
            assert np.array_equal(got[[1, 3]], pattern(2, t, BLOCKS, BB)[[1, 3]])
        assert decoder.call(op="push", cluster=1, remote_cache=prompt.info["alloc"], local="reg",
                            src=[9, 10, 11], dst=[15, 14, 13]) == {"ok": True}
        for t in range(TENSORS):
            got = prompt.read("alloc", t).reshape(BLOCKS, BB)
            assert np.array_equal(got[[15, 14, 13]], pattern(2, t, BLOCKS, BB)[[9, 10, 11]])
            assert np.array_equal(got[:13], pattern(1, t, BLOCKS, BB)[:13])
    finally:
        decoder.close()
        prompt.close()


@pytest.mark.parametrize("listen", ["ip", "0.0.0.0"])
def test_token_link_between_two_hosts(two_hosts, listen, monkeypatch):
    """Contract: with an AuthToken the proofs name the listener's address as dialled (here a veth
    IP); the listener, bound to that IP or to the wildcard, sees the same one, so the link works."""
    ns_a, ns_b, subnet = two_hosts
    monkeypatch.setenv("KVBLOCKS_UCX_PLUGIN", "off")
    where = f"{subnet}.1" if listen == "ip" else listen
    prompt = Peer(1, listen=f"{where}:26556", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB,
                  prefix=("ip", "netns", "exec", ns_a), role="PROMPT", auth="two-hosts")
    decoder = Peer(2, tensors=TENSORS, blocks=BLOCKS, block_bytes=BB, prefix=("ip", "netns", "exec", ns_b),
                   role="MIX", auth="two-hosts")
    try:
        assert decoder.call(op="link", cluster=1, ip=f"{subnet}.1", port=26556) == {"rets": [0], "path": "tcp"}
        assert decoder.call(op="pull", cluster=1, remote_cache=prompt.info["reg"], local="alloc",
                            src=[2, 4], dst=[0, 1]) == {"ok": True}
        for t in range(TENSORS):
            got = decoder.read("alloc", t).reshape(BLOCKS, BB)
            assert np.array_equal(got[[0, 1]], pattern(1, t, BLOCKS, BB)[[2, 4]])
    finally:
        decoder.close()
        prompt.close()
