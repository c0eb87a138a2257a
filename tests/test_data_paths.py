# SPDX-License-Identifier: Apache-2.0
"""Every data path (shared memory, CMA, TCP) moves verified data both ways between two processes."""
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
    alloc = me.allocate_cache(desc)
    arrays = [np.zeros((BLOCKS, BB), np.uint8) for _ in range(TENSORS)]
    reg = me.register_arrays(arrays)
    for t in range(TENSORS):
        alloc.numpy(t)[:] = pattern(2, t, BLOCKS, BB)
        arrays[t][:] = pattern(2, t, BLOCKS, BB)
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    yield transport, peer, me, {"alloc": alloc, "reg": reg}
    me.finalize()
    peer.close()


def test_path_chosen_at_link_time(linked):
    transport, peer, me, _ = linked
    assert me.link_path(1) == ("tcp" if transport == "tcp" else "shm+cma")


@pytest.mark.parametrize("remote", ["alloc", "reg"])
@pytest.mark.parametrize("local", ["alloc", "reg"])
def test_pull_from_other_process(linked, remote, local):
    _, peer, me, caches = linked
    dst = caches[local]
    me.pull_kv_blocks(kb.CacheIndex(1, peer.info[remote]), dst, [1, 3, 5, 7], [0, 2, 4, 6])
    for t in range(TENSORS):
        got = dst.numpy(t)
        want_remote = pattern(1, t, BLOCKS, BB)
        mine = pattern(2, t, BLOCKS, BB)
        for d, s in zip([0, 2, 4, 6], [1, 3, 5, 7]):
            assert np.array_equal(got[d], want_remote[s])
        for d in [1, 3, 5, 7]:
            assert np.array_equal(got[d], mine[d])


@pytest.mark.parametrize("remote", ["alloc", "reg"])
@pytest.mark.parametrize("local", ["alloc", "reg"])
def test_push_to_other_process(linked, remote, local):
    _, peer, me, caches = linked
    me.push_kv_blocks(caches[local], kb.CacheIndex(1, peer.info[remote]), [0, 1, 2, 3], [7, 6, 5, 4])
    for t in range(TENSORS):
        got = peer.read(remote, t).reshape(BLOCKS, BB)
        mine = pattern(2, t, BLOCKS, BB)
        theirs = pattern(1, t, BLOCKS, BB)
        for s, d in zip([0, 1, 2, 3], [7, 6, 5, 4]):
            assert np.array_equal(got[d], mine[s])
        for d in range(4):
            assert np.array_equal(got[d], theirs[d])


@pytest.mark.parametrize("remote", ["alloc", "reg"])
def test_listener_side_pushes_and_pulls_over_the_same_link(linked, remote):
    """The link is usable both ways: the side that accepted it pushes to and pulls from us."""
    _, peer, me, caches = linked
    r = peer.call(op="push", cluster=2, remote_cache=caches[remote].cache_id, local="alloc",
                  src=[0, 1], dst=[5, 6])
    assert r == {"ok": True}
    for t in range(TENSORS):
        got = caches[remote].numpy(t)
        assert np.array_equal(got[5], pattern(1, t, BLOCKS, BB)[0])
        assert np.array_equal(got[6], pattern(1, t, BLOCKS, BB)[1])
    r = peer.call(op="pull", cluster=2, remote_cache=caches[remote].cache_id, local="reg", src=[3], dst=[0])
    assert r == {"ok": True}
    assert np.array_equal(peer.read("reg", 2).reshape(BLOCKS, BB)[0], pattern(2, 2, BLOCKS, BB)[3])


@pytest.mark.parametrize("remote", ["alloc", "reg"])
def test_a_cache_the_peer_unregistered_is_gone_on_every_path(linked, remote):
    """Unregistering tells same-host peers to stop using the memory before it can be freed; the
    next transfer reports LLM_KV_CACHE_NOT_EXIST instead of touching it."""
    _, peer, me, caches = linked
    idx = kb.CacheIndex(1, peer.info[remote])
    me.pull_kv_blocks(idx, caches["alloc"], [1], [0])
    assert peer.call(op="unregister", cache=remote) == {"ok": True}
    for call in (lambda: me.pull_kv_blocks(idx, caches["alloc"], [1], [0]),
                 lambda: me.push_kv_blocks(caches["alloc"], idx, [1], [0])):
        with pytest.raises(kb.CacheNotExistError):
            call()
    assert me.link_path(1) != ""  # the link itself stays up


def test_large_tcp_stream_then_small_frames_on_the_same_channel():
    """A receive of several MiB raises the socket's wake-up mark (SO_RCVLOWAT): it must fall to what
    is still to come near the end, and back to 1 after, or the next small frame on that channel
    waits out its deadline. Both ways, with tails that are not a multiple of the mark."""
    tensors, blocks, bb = 4, 8, (1 << 20) + 4096
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=tensors, blocks=blocks, block_bytes=bb)
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: "tcp", kb.OPTION_SYNC_CACHE_WAIT_TIME: "3000"})
    try:
        local = me.allocate_cache(kb.CacheDesc(tensors, kb.DataType.DT_UINT8, [blocks, bb]))
        mine = [pattern(2, t, blocks, bb) for t in range(tensors)]
        theirs = [pattern(1, t, blocks, bb) for t in range(tensors)]
        for t in range(tensors):
            local.numpy(t)[:] = mine[t]
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        remote = kb.CacheIndex(1, peer.info["alloc"])
        steps = [("push", [1, 3, 6], [1, 3, 6]),   # 12 MiB, then a small frame each way
                 ("pull", [0], [0]), ("push", [2], [0]),
                 ("pull", [2, 4, 5, 7], [2, 4, 5, 7]),  # 16 MiB
                 ("push", [5], [7]), ("pull", [1], [1])]
        for op, src, dst in steps:
            if op == "pull":
                me.pull_kv_blocks(remote, local, src, dst)
            else:
                me.push_kv_blocks(local, remote, src, dst)
            a, b = (theirs, mine) if op == "pull" else (mine, theirs)
            for t in range(tensors):
                b[t][dst] = a[t][src]
        for t in range(tensors):
            assert np.array_equal(local.numpy(t), mine[t])
            assert np.array_equal(peer.read("alloc", t).reshape(blocks, bb), theirs[t])
    finally:
        me.finalize()
        peer.close()
