# SPDX-License-Identifier: Apache-2.0
"""Same-host paths go only to the process that owns the TCP peer (README "Security and threat model").

A links to a hostile listener H (tests/relay.py, its own process). H links on to B, an honest engine
in a third process on the same host, hands A the local-exchange name and key B gave it, and announces
a cache of its own at memory B never registered. A verifies the pid at the other end of the Unix
socket (B), but B is not the process at the far end of A's control connection (H): A must get a TCP
link to H, B a TCP link to H, nothing read from B's heap and nothing written to it."""
import json
import multiprocessing
import os
import subprocess
import sys

import pytest

import kvblocks as kb
from conftest import cluster, free_port
from hostile import authenticate
from procs import Peer
from relay import CACHE_ID, CLUSTER

S = kb.Status
HERE = os.path.dirname(os.path.abspath(__file__))
HEAP = 4096  # the bytes of B's unregistered buffer that H announces as a cache: 2 tensors, 8 blocks of 256
TOKEN = "s3cret"

# A's token, B's token, H's token, whether H passes the authentication frames through unchanged.
# (Tokens on A and B only, H passing the authentication through: no link at all, see below.)
CASES = {
    "no token": (None, None, None, False),
    "tokens everywhere": (TOKEN, TOKEN, TOKEN, False),
}


class Relay:
    """tests/relay.py in its own process, relaying to the engine listening at `target`."""

    def __init__(self, target, addr, token, forward_auth):
        argv = [sys.executable, os.path.join(HERE, "relay.py"), "--target", str(target), "--addr", str(addr),
                "--bytes", str(HEAP)]
        argv += ["--token", token] if token else []
        argv += ["--forward-auth"] if forward_auth else []
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.port = json.loads(self.proc.stdout.readline())["port"]

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _engine(cid, token=None, port=None):
    e = kb.LlmDataDist(cid, kb.LlmRole.MIX)
    o = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "2000"}
    if token:
        o[kb.OPTION_AUTH_TOKEN] = token
    if port:
        o[kb.OPTION_LISTEN_IP_INFO] = f"127.0.0.1:{port}"
    e.initialize(o)
    return e


def _status(fn):
    try:
        fn()
        return S.LLM_SUCCESS
    except kb.LLMException as e:
        return e.status_code


@pytest.mark.parametrize("case", list(CASES))
def test_a_relaying_listener_gets_tcp_never_a_third_process(case):
    """Contract: same-host paths go only to the process that owns the TCP peer. With H relaying the
    local exchange to B (no token; tokens everywhere), A's link to H and B's link to H are TCP,
    A's pull of H's "cache" reads nothing of B's heap and A's push leaves it unchanged."""
    tok_a, tok_b, tok_h, forward = CASES[case]
    port_b = free_port()
    b = Peer(2, listen=f"127.0.0.1:{port_b}", auth=tok_b)
    a = _engine(1, tok_a)
    h = None
    try:
        if tok_b and not tok_h:  # without the token H cannot link to B on its own
            s, status = authenticate(port_b, 1, CLUSTER)
            s.close()
            assert status == S.LLM_LINK_FAILED
        heap = b.call(op="heap", size=HEAP)
        h = Relay(port_b, heap["addr"], tok_h, forward)
        cid = 2 if forward else CLUSTER  # the cluster id A is told it links to
        assert a.link_llm_clusters([cluster(cid, h.port)], 5000) == [S.LLM_SUCCESS]
        dst = a.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 256]))
        src = a.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 256]))
        for t in range(2):
            src.numpy(t)[:] = 0x5A
        blocks = list(range(8))
        pulled = _status(lambda: a.pull_kv_blocks(kb.CacheIndex(cid, CACHE_ID), dst, blocks, blocks))
        read = any(b"UNREGISTERED-HEAP" in dst.numpy(t).tobytes() for t in range(2))
        pushed = _status(lambda: a.push_kv_blocks(src, kb.CacheIndex(cid, CACHE_ID), blocks, blocks))
        facts = {"A's path": a.link_path(cid), "B's path": b.call(op="path", cluster=1 if forward else CLUSTER)["path"],
                 "A read B's heap": read, "B's heap changed": b.call(op="heap", size=HEAP)["hex"] != heap["hex"],
                 "pull failed": pulled != S.LLM_SUCCESS, "push failed": pushed != S.LLM_SUCCESS}
        assert facts == {"A's path": "tcp", "B's path": "tcp", "A read B's heap": False, "B's heap changed": False,
                         "pull failed": True, "push failed": True}
    finally:
        if h:
            h.close()
        a.finalize()
        b.close()


def test_without_the_token_a_relay_passing_the_authentication_through_links_to_neither_side():
    """Tokens on A and B only: H, passing A's authentication frames through to B, is refused by B (the
    proof names H's address, not B's) and by A (B's proof names B's): no link at all, B's heap untouched."""
    port_b = free_port()
    b = Peer(2, listen=f"127.0.0.1:{port_b}", auth=TOKEN)
    a = _engine(1, TOKEN)
    h = None
    try:
        heap = b.call(op="heap", size=HEAP)
        h = Relay(port_b, heap["addr"], None, True)
        assert a.link_llm_clusters([cluster(2, h.port)], 5000) == [S.LLM_LINK_FAILED]
        assert json.loads(h.proc.stdout.readline()) == {"refused_by_target": True}
        assert a.link_path(2) == ""
        assert b.call(op="path", cluster=1)["path"] == ""
        assert b.call(op="heap", size=HEAP)["hex"] == heap["hex"]
    finally:
        if h:
            h.close()
        a.finalize()
        b.close()


def test_without_the_token_a_relay_that_authenticates_itself_links_to_neither_side():
    """Tokens on A and B only: H, authenticating itself, is refused by A (no proof of the token) and
    by B (HELLO_ACK LLM_LINK_FAILED): no link at all, B's heap untouched."""
    port_b = free_port()
    b = Peer(2, listen=f"127.0.0.1:{port_b}", auth=TOKEN)
    a = _engine(1, TOKEN)
    h = None
    try:
        heap = b.call(op="heap", size=HEAP)
        h = Relay(port_b, heap["addr"], None, False)
        assert a.link_llm_clusters([cluster(CLUSTER, h.port)], 5000) == [S.LLM_LINK_FAILED]
        s, status = authenticate(port_b, 1, CLUSTER)
        s.close()
        assert status == S.LLM_LINK_FAILED
        assert a.link_path(CLUSTER) == ""
        assert b.call(op="path", cluster=CLUSTER)["path"] == ""
        assert b.call(op="heap", size=HEAP)["hex"] == heap["hex"]
    finally:
        if h:
            h.close()
        a.finalize()
        b.close()


@pytest.mark.parametrize("token", [None, TOKEN])
def test_honest_same_host_engines_still_get_one_sided_paths(token):
    """Contract: the check costs honest peers nothing but a look at the control socket. A and B in two
    processes (B spawned) link either way round with one-sided paths on both sides, and the bytes
    pulled over them are B's."""
    port_a, port_b = free_port(), free_port()
    b = Peer(2, listen=f"127.0.0.1:{port_b}", auth=token)
    a = _engine(1, token, port_a)
    try:
        assert a.link_llm_clusters([cluster(2, port_b)], 5000) == [S.LLM_SUCCESS]
        assert a.link_path(2) in ("shm", "cma", "shm+cma")
        assert b.call(op="path", cluster=1)["path"] in ("shm", "cma", "shm+cma")
        dst = a.allocate_cache(kb.CacheDesc(b.tensors, kb.DataType.DT_UINT8, [b.blocks, b.block_bytes]))
        a.pull_kv_blocks(kb.CacheIndex(2, b.info["alloc"]), dst, [3], [3])
        assert bytes(dst.numpy(1)[3]) == bytes.fromhex(b.call(op="read", cache="alloc", tensor=1)["hex"])[
            3 * b.block_bytes:4 * b.block_bytes]
        assert a.unlink_llm_clusters([cluster(2, port_b)]) == [S.LLM_SUCCESS]
        assert b.call(op="link", cluster=1, ip="127.0.0.1", port=port_a)["path"] in ("shm", "cma", "shm+cma")
        assert a.link_path(2) in ("shm", "cma", "shm+cma")
    finally:
        a.finalize()
        b.close()


def test_an_older_same_host_peer_that_states_no_ends_gets_tcp():
    """Contract: a peer that does not state its control connection's ends (kvblocks before the check,
    tests/old_local_peer.py in its own process) gets a TCP link, even though it answers the old local
    exchange correctly from its own process."""
    old = subprocess.Popen([sys.executable, os.path.join(HERE, "old_local_peer.py")], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    a = _engine(1)
    try:
        port = json.loads(old.stdout.readline())["port"]
        assert a.link_llm_clusters([cluster(CLUSTER, port)], 5000) == [S.LLM_SUCCESS]
        assert a.link_path(CLUSTER) == "tcp"
    finally:
        a.finalize()
        old.stdin.close()
        old.wait(5)


def _serve_b(port, conn):
    """B in a child process (forked or spawned): one cache filled with 0x42 until the parent is done."""
    b = _engine(2, None, port)
    c = b.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 256]))
    for t in range(2):
        c.numpy(t)[:] = 0x42
    conn.send(c.cache_id)
    conn.recv()
    b.finalize()


# "spawn" is left out: a spawned child imports this test module by name, which fails with pytest's
# importlib import mode outside the checkout (as CI runs it); fork is the case this test guards.
@pytest.mark.parametrize("start", ["fork"])
def test_engines_across_a_plain_fork_or_spawn_keep_one_sided_paths(start):
    """Contract: the check keeps honest same-host paths: B in a child made by a plain fork (or spawn)
    of this process is reached over shared memory or CMA, and the bytes pulled are B's. This process
    links two engines of its own first, so its in-process secret exists before the fork: a forked
    child must not keep it (it would pass for its parent and never try the same-host exchange)."""
    port = free_port()
    x, y = _engine(3, None, port), _engine(4)
    assert y.link_llm_clusters([cluster(3, port)], 5000) == [S.LLM_SUCCESS] and y.link_path(3) == "inprocess"
    y.finalize()
    x.finalize()
    ctx = multiprocessing.get_context(start)
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_serve_b, args=(port, theirs))
    child.start()
    a = None
    try:
        assert ours.poll(30)
        cache = ours.recv()
        a = _engine(1)
        assert a.link_llm_clusters([cluster(2, port)], 5000) == [S.LLM_SUCCESS]
        assert a.link_path(2) in ("shm", "cma", "shm+cma")
        dst = a.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 256]))
        a.pull_kv_blocks(kb.CacheIndex(2, cache), dst, [5], [5])
        assert (dst.numpy(1)[5] == 0x42).all()
    finally:
        if a:
            a.finalize()
        ours.send("done")
        child.join(10)
