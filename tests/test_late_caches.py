# SPDX-License-Identifier: Apache-2.0
"""Caches registered after the link (issue 31): CANN looks a remote cache up when a transfer names
it, so its samples allocate the prompt's cache after linking. kvblocks asks the peer for a cache id
its link-time table lacks, once, over the link's control connection (CACHE_QUERY / CACHE_INFO,
docs/protocol.md), keeps the answer on the link and reaches that cache over TCP. Real second
processes, real sockets."""
import threading

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from peer import pattern
from procs import Peer

TENSORS, BLOCKS, BB = 4, 8, 64


@pytest.fixture(params=["auto", "tcp"])
def linked(request):
    transport = request.param
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport=transport, tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport})
    desc = kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB])
    mine = me.allocate_cache(desc)
    for t in range(TENSORS):
        mine.numpy(t)[:] = pattern(2, t, BLOCKS, BB)
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    yield transport, peer, me, mine, desc
    me.finalize()
    peer.close()


def late(peer, name="late", seed=9):
    """The peer allocates a cache now, after the link, filled with `seed`'s pattern."""
    return peer.call(op="alloc", name=name, seed=seed)["cache"]


def test_pull_and_push_a_cache_the_peer_allocated_after_the_link(linked):
    transport, peer, me, mine, _ = linked
    path = me.link_path(1)
    cid = late(peer)
    idx = kb.CacheIndex(1, cid)
    me.pull_kv_blocks(idx, mine, [1, 3, 5, 7], [0, 2, 4, 6])
    for t in range(TENSORS):
        got, theirs, own = mine.numpy(t), pattern(9, t, BLOCKS, BB), pattern(2, t, BLOCKS, BB)
        for d, s in zip([0, 2, 4, 6], [1, 3, 5, 7]):
            assert np.array_equal(got[d], theirs[s])
        for d in [1, 3, 5, 7]:
            assert np.array_equal(got[d], own[d])
    # Known now: the second transfer (a push) finds it without asking.
    me.push_kv_blocks(mine, idx, [1, 3], [6, 7])
    for t in range(TENSORS):
        got = peer.read("late", t).reshape(BLOCKS, BB)
        assert np.array_equal(got[6], pattern(2, t, BLOCKS, BB)[1])
        assert np.array_equal(got[7], pattern(2, t, BLOCKS, BB)[3])
        assert np.array_equal(got[:6], pattern(9, t, BLOCKS, BB)[:6])
    assert me.link_path(1) == path  # link-time caches keep their paths
    # The link-time caches still work on their own path.
    me.pull_kv_blocks(kb.CacheIndex(1, peer.info["alloc"]), mine, [2], [2])
    assert np.array_equal(mine.numpy(0)[2], pattern(1, 0, BLOCKS, BB)[2])


def test_batch_variants_and_async_on_a_late_cache(linked):
    _, peer, me, mine, _ = linked
    cid = late(peer, seed=11)
    me.pull_kv_cache(kb.CacheIndex(1, cid, 3), mine, 5)  # row 3 -> row 5 (a MIX cache: a row is a block)
    for t in range(TENSORS):
        assert np.array_equal(mine.numpy(t)[5], pattern(11, t, BLOCKS, BB)[3])
    cid2 = late(peer, name="late2", seed=12)  # first use asynchronous
    h = me.pull_kv_blocks_async(kb.CacheIndex(1, cid2), mine, [0, 1], [0, 1])
    h.wait(timeout=10)
    assert h.status == kb.Status.LLM_SUCCESS
    for t in range(TENSORS):
        assert np.array_equal(mine.numpy(t)[:2], pattern(12, t, BLOCKS, BB)[:2])
    cid3 = late(peer, name="late3", seed=13)  # first use a push
    me.push_kv_cache(mine, kb.CacheIndex(1, cid3, 4), 0)
    assert np.array_equal(peer.read("late3", 1).reshape(BLOCKS, BB)[4], mine.numpy(1)[0])


def test_the_peer_asks_for_a_cache_we_allocated_after_the_link(linked):
    """The accepting side asks the opener the same way."""
    _, peer, me, _, desc = linked
    c = me.allocate_cache(desc)
    for t in range(TENSORS):
        c.numpy(t)[:] = pattern(21, t, BLOCKS, BB)
    assert peer.call(op="pull", cluster=2, remote_cache=c.cache_id, local="alloc", src=[4], dst=[1]) == {"ok": True}
    assert np.array_equal(peer.read("alloc", 2).reshape(BLOCKS, BB)[1], pattern(21, 2, BLOCKS, BB)[4])
    assert peer.call(op="push", cluster=2, remote_cache=c.cache_id, local="alloc", src=[0], dst=[7]) == {"ok": True}
    assert np.array_equal(c.numpy(3)[7], pattern(1, 3, BLOCKS, BB)[0])


def test_many_callers_race_for_the_first_use(linked):
    _, peer, me, _, desc = linked
    cid = late(peer, seed=5)
    locals_ = [me.allocate_cache(desc) for _ in range(6)]
    errors = []

    def run(c):
        try:
            me.pull_kv_blocks(kb.CacheIndex(1, cid), c, list(range(BLOCKS)), list(range(BLOCKS)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in locals_]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors
    for c in locals_:
        for t in range(TENSORS):
            assert np.array_equal(c.numpy(t), pattern(5, t, BLOCKS, BB))


def test_an_id_the_peer_never_registered_is_not_found(linked):
    _, peer, me, mine, _ = linked
    before = [mine.numpy(t).copy() for t in range(TENSORS)]
    for cid in (peer.info["alloc"] + 1000, 0, -3):
        with pytest.raises(kb.CacheNotExistError) as ei:
            me.pull_kv_blocks(kb.CacheIndex(1, cid), mine, [0], [0])
        assert "as of linking" not in str(ei.value)
        with pytest.raises(kb.CacheNotExistError):
            me.push_kv_blocks(mine, kb.CacheIndex(1, cid), [0], [0])
    # Asking again (not cached as absent): the peer registers it later and it is found.
    nxt = peer.info["alloc"] + 2  # alloc, reg, then the next id
    assert late(peer) == nxt
    me.pull_kv_blocks(kb.CacheIndex(1, nxt), mine, [0], [0])
    assert np.array_equal(mine.numpy(0)[0], pattern(9, 0, BLOCKS, BB)[0])
    assert all(np.array_equal(mine.numpy(t)[1:], before[t][1:]) for t in range(TENSORS))
    assert me.link_path(1) != ""


@pytest.mark.parametrize("used_first", [False, True])
def test_a_late_cache_unregistered_on_the_peer_is_not_found(linked, used_first):
    _, peer, me, mine, _ = linked
    cid = late(peer)
    idx = kb.CacheIndex(1, cid)
    if used_first:
        me.pull_kv_blocks(idx, mine, [1], [0])
    assert peer.call(op="unregister", cache="late") == {"ok": True}
    for call in (lambda: me.pull_kv_blocks(idx, mine, [1], [0]),
                 lambda: me.push_kv_blocks(mine, idx, [1], [0])):
        with pytest.raises(kb.CacheNotExistError):
            call()
    assert me.link_path(1) != ""  # the link stays up
    me.pull_kv_blocks(kb.CacheIndex(1, peer.info["alloc"]), mine, [3], [3])


def test_layer_wise_push_to_a_late_cache(linked):
    _, peer, me, mine, _ = linked
    cid = late(peer, name="lw", seed=32)
    with me.open_layer_push(mine, kb.CacheIndex(1, cid), [0, 2], [5, 6]) as lp:
        for layer in range(lp.num_layers):
            lp.layer_ready(layer)
    assert lp.status == kb.Status.LLM_SUCCESS
    for t in range(TENSORS):
        got = peer.read("lw", t).reshape(BLOCKS, BB)
        assert np.array_equal(got[5], pattern(2, t, BLOCKS, BB)[0])
        assert np.array_equal(got[6], pattern(2, t, BLOCKS, BB)[2])
        assert np.array_equal(got[:5], pattern(32, t, BLOCKS, BB)[:5])


# ---------------------------------------------------------------- by key (CacheKey, BlocksCacheKey)
def test_keys_bound_after_the_link_are_found_by_key(linked):
    """CACHE_QUERY by batch key and by cache key: a cache the peer allocated with keys after the link."""
    _, peer, me, mine, _ = linked
    cid = peer.call(op="alloc", name="keyed", seed=41, keys=[1000, -1, 1002])["cache"]
    assert tuple(me._find_remote_key(1, 1002)) == (cid, 2)
    me.pull_kv_cache(kb.CacheIndex(1, cid, 2), mine, 0)  # row 2 -> row 0
    for t in range(TENSORS):
        assert np.array_equal(mine.numpy(t)[0], pattern(41, t, BLOCKS, BB)[2])
    assert tuple(me._find_remote_key(1, 1000)) == (cid, 0)  # known now: no round trip
    tagged = peer.call(op="alloc", name="tagged", seed=42, key=77)["cache"]
    assert me._find_remote_cache(1, 77) == tagged
    assert tuple(me._find_remote_key(1, 77)) == (tagged, 0)  # a tagged cache, as at link time
    me.pull_kv_blocks(kb.CacheIndex(1, tagged), mine, [6, 7], [1, 2])
    for t in range(TENSORS):
        assert np.array_equal(mine.numpy(t)[1:3], pattern(42, t, BLOCKS, BB)[6:8])
    # Unknown keys: not found, and not remembered as absent.
    for call in (lambda: me._find_remote_key(1, 5555), lambda: me._find_remote_cache(1, 5555),
                 lambda: me._find_remote_key(1, -4)):
        with pytest.raises(kb.CacheNotExistError):
            call()
    later = peer.call(op="alloc", name="later", seed=43, keys=[5555])["cache"]
    assert tuple(me._find_remote_key(1, 5555)) == (later, 0)
    with pytest.raises(kb.CacheNotExistError):
        me._find_remote_cache(1, 5555)  # a batch key is not a cache key
    assert me.link_path(1) != ""


def test_key_release_of_a_cache_found_by_key(linked):
    """KEY_CONSUMED and KEY_RELEASED for a keyed cache the link learned by CACHE_QUERY."""
    _, peer, me, mine, _ = linked
    cid = peer.call(op="alloc", name="rel", seed=51, keys=[3001, 3002])["cache"]
    assert tuple(me._find_remote_key(1, 3001)) == (cid, 0)
    me.pull_kv_cache(kb.CacheIndex(1, cid, 0), mine, 4)
    assert np.array_equal(mine.numpy(1)[4], pattern(51, 1, BLOCKS, BB)[0])
    me._release_remote_key(1, cid, 3001)  # we consumed it: gone here at once, the owner unbinds it
    with pytest.raises(kb.CacheNotExistError):
        me._find_remote_key(1, 3001)
    with pytest.raises(kb.CacheNotExistError):
        me._find_remote_key(1, 9999)  # a round trip after KEY_CONSUMED: the owner has read it
    assert peer.call(op="unbind", cache="rel", key=3001) == {"was": False}
    # The owner releases the other key: KEY_RELEASED reaches the link's entry for the late cache.
    assert tuple(me._find_remote_key(1, 3002)) == (cid, 1)
    assert peer.call(op="unbind", cache="rel", key=3002) == {"was": True}
    with pytest.raises(kb.CacheNotExistError):
        me._find_remote_key(1, 9998)  # ordered after KEY_RELEASED on the control connection
    with pytest.raises(kb.CacheNotExistError):
        me._find_remote_key(1, 3002)


def test_the_peer_finds_our_late_keys(linked):
    """The accepting side asks the opener by key the same way."""
    _, peer, me, _, desc = linked
    c = me.allocate_cache(desc)
    me._set_batch_keys(c, [-1, -1, 4242])
    assert peer.call(op="find_key", cluster=2, key=4242) == {"cache": c.cache_id, "batch": 2}
    r = peer.call(op="find_key", cluster=2, key=4243)
    assert r.get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST, r
    # A key bound after the link to a cache of the link-time table: found, and reached by id through
    # that table as before.
    mine = linked[3]
    me._set_batch_keys(mine, [-1, 4343])
    assert peer.call(op="find_key", cluster=2, key=4343) == {"cache": mine.cache_id, "batch": 1}
    assert peer.call(op="pull", cluster=2, remote_cache=mine.cache_id, local="alloc", src=[1], dst=[5]) == {"ok": True}
    assert np.array_equal(peer.read("alloc", 0).reshape(BLOCKS, BB)[5], pattern(2, 0, BLOCKS, BB)[1])
