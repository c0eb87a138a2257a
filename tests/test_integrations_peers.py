# SPDX-License-Identifier: Apache-2.0
"""kvblocks.integrations.peers with real engines: this process against tests/peer.py in a second process
(linking once, finding a cache by key in the link-time table, relinking after the peer was killed and
restarted or the link broke, refusing another engine at the address)."""
import os
import signal

import numpy as np
import pytest

import kvblocks as kb
from conftest import free_port
from kvblocks.integrations.peers import Peers, cache_key_of, cluster_id_of
from peer import pattern
from procs import Peer as Proc
from procs import wait_stopped

ENGINE = "prefill-0"
KEY = cache_key_of("kv")
TENSORS, BLOCKS, BLOCK_BYTES = 2, 8, 64


def start(port, engine=ENGINE, seed=7):
    """A remote engine (second process) with a cache registered under KEY, filled with seed's pattern."""
    proc = Proc(cluster_id_of(engine), listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS,
                block_bytes=BLOCK_BYTES)
    cid = proc.call(op="alloc", name="kv", seed=seed, key=KEY)["cache"]
    return proc, cid


@pytest.fixture
def local():
    dd = kb.LlmDataDist(cluster_id_of("decode-0"), kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "2000"})
    cache = dd.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
    yield dd, cache
    dd.finalize()


def pull_all(peers, p, cache):
    peers.dd.pull_kv_blocks(kb.CacheIndex(p.cluster_id, peers.find_cache(p, KEY)), cache, list(range(BLOCKS)),
                            list(range(BLOCKS)))
    return [np.array(cache.numpy(t)) for t in range(TENSORS)]


def test_cluster_ids_and_keys_are_stable_and_valid():
    assert cluster_id_of("a") == cluster_id_of("a") != cluster_id_of("b")
    assert 0 < cluster_id_of("x" * 256) < 2 ** 56
    assert 0 <= cache_key_of("kv") < 2 ** 63 and cache_key_of("kv") != cache_key_of("kv2")


def test_link_once_and_find_the_cache_by_key(local):
    dd, cache = local
    port = free_port()
    proc, cid = start(port)
    try:
        peers = Peers(dd)
        p = peers.get(ENGINE, "127.0.0.1", port)
        assert peers.get(ENGINE, "127.0.0.1", port) is p
        peers.ensure_linked(p)
        peers.ensure_linked(p)
        assert p.links == 1 and peers.is_up(p)
        assert peers.find_cache(p, KEY) == cid
        got = pull_all(peers, p, cache)
        assert all((got[t] == pattern(7, t, BLOCKS, BLOCK_BYTES)).all() for t in range(TENSORS))
        with pytest.raises(kb.LLMException):
            peers.find_cache(p, cache_key_of("no such cache"))
    finally:
        proc.close()


def test_relink_after_the_peer_was_killed_and_restarted(local):
    dd, cache = local
    port = free_port()
    proc, _ = start(port)
    try:
        peers = Peers(dd, link_timeout_ms=2000)
        p = peers.get(ENGINE, "127.0.0.1", port)
        peers.ensure_linked(p)
        pull_all(peers, p, cache)
        proc.close(kill=True)
        proc, cid2 = start(port, seed=9)  # same engine, same address, another cache id and content
        with pytest.raises(kb.LLMException):
            pull_all(peers, p, cache)  # the old link is dead
        assert not peers.is_up(p)  # the runtime dropped it: no mark needed
        peers.ensure_linked(p)
        assert p.links == 2 and peers.find_cache(p, KEY) == cid2
        got = pull_all(peers, p, cache)
        assert (got[1] == pattern(9, 1, BLOCKS, BLOCK_BYTES)).all()
    finally:
        proc.close()


def test_a_link_marked_broken_is_dropped_and_made_again(local):
    dd, cache = local
    port = free_port()
    proc, _ = start(port)
    try:
        peers = Peers(dd)
        p = peers.get(ENGINE, "127.0.0.1", port)
        peers.ensure_linked(p)
        peers.mark_broken(p)
        peers.ensure_linked(p)
        assert p.links == 2 and peers.is_up(p)
        pull_all(peers, p, cache)
    finally:
        proc.close()


def test_a_link_broken_by_a_timeout_is_made_again():
    """A frozen peer: a TCP pull times out and the runtime drops the link (transfers fail even after the
    peer runs again); the next ensure_linked links again, and pulls work."""
    dd = kb.LlmDataDist(cluster_id_of("decode-0"), kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "300", kb.OPTION_TRANSPORT: "tcp"})
    cache = dd.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
    port = free_port()
    proc, _ = start(port)
    try:
        peers = Peers(dd)
        p = peers.get(ENGINE, "127.0.0.1", port)
        peers.ensure_linked(p)
        os.kill(proc.proc.pid, signal.SIGSTOP)
        wait_stopped(proc.proc.pid)
        try:
            with pytest.raises(kb.LLMTimeoutError):
                pull_all(peers, p, cache)
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        with pytest.raises(kb.LLMException):
            pull_all(peers, p, cache)  # not linked any more, though the peer runs again
        assert not peers.is_up(p)
        peers.ensure_linked(p)
        assert p.links == 2
        got = pull_all(peers, p, cache)
        assert (got[0] == pattern(7, 0, BLOCKS, BLOCK_BYTES)).all()
    finally:
        dd.finalize()
        proc.close()


def test_another_engine_at_the_address_is_refused(local):
    """A client's params name engine "prefill-0" at an address where another engine listens: no link."""
    dd, _ = local
    port = free_port()
    proc, _ = start(port, engine="someone-else")
    try:
        peers = Peers(dd, link_timeout_ms=1000)
        p = peers.get(ENGINE, "127.0.0.1", port)
        with pytest.raises(ConnectionError, match="wrong_cluster_id"):
            peers.ensure_linked(p)
        assert not peers.is_up(p)
    finally:
        proc.close()


def test_bad_ids_and_the_peer_table_are_bounded(local):
    dd, _ = local
    peers = Peers(dd, max_peers=2)
    for bad in ("", "x" * 257, 5, None):
        with pytest.raises(ValueError):
            peers.get(bad, "127.0.0.1", 1000)
    with pytest.raises(ValueError):
        peers.get("e", "127.0.0.1", 70000)
    peers.get("e1", "127.0.0.1", 1000)
    peers.get("e1", "127.0.0.2", 1000)  # same engine id elsewhere: another peer, not a redirect
    assert len(peers.by_cluster(cluster_id_of("e1"))) == 2
    with pytest.raises(ValueError, match="more than 2"):
        peers.get("e2", "127.0.0.1", 1000)
