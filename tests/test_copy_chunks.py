# SPDX-License-Identifier: Apache-2.0
"""Large same-host copies go in chunks over the copy pool (transport/copy_pool.*): every byte lands
once, in its place, for both ways of cutting a plan (pieces of a big tensor; groups of small tensors),
on shared memory (alloc) and CMA (reg), pull and push."""
import threading

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from peer import pattern
from procs import Peer, read_process_memory

# (tensors, blocks, block bytes, src blocks, dst blocks): per-tensor bytes over 1 MiB with segments that
# straddle the cut points; then 40 tensors of 192 KiB moved, whole tensors per chunk, a partial last chunk.
SHAPES = {
    "cut": (4, 40, 100_008, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 20, 39, 38, 30, 31, 32, 33],
            [39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 0, 1, 2, 3, 4, 5, 10, 11, 12, 13]),
    "whole": (40, 8, 64 * 1024, [0, 1, 5], [7, 6, 2]),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def linked(request):
    tensors, blocks, bb, src, dst = SHAPES[request.param]
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", tensors=tensors, blocks=blocks, block_bytes=bb)
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0"})
    alloc = me.allocate_cache(kb.CacheDesc(tensors, kb.DataType.DT_UINT8, [blocks, bb]))
    arrays = [np.zeros((blocks, bb), np.uint8) for _ in range(tensors)]
    reg = me.register_arrays(arrays)
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    yield SHAPES[request.param], peer, me, {"alloc": alloc, "reg": reg}
    me.finalize()
    peer.close()


def _fill(cache, tensors, blocks, bb):
    for t in range(tensors):
        cache.numpy(t)[:] = pattern(2, t, blocks, bb)


@pytest.mark.parametrize("remote", ["alloc", "reg"])
@pytest.mark.parametrize("local", ["alloc", "reg"])
def test_large_pull_lands_every_byte_once(linked, remote, local):
    (tensors, blocks, bb, src, dst), peer, me, caches = linked
    _fill(caches[local], tensors, blocks, bb)
    me.pull_kv_blocks(kb.CacheIndex(1, peer.info[remote]), caches[local], src, dst)
    for t in range(tensors):
        want = pattern(2, t, blocks, bb)
        want[dst] = pattern(1, t, blocks, bb)[src]
        assert np.array_equal(caches[local].numpy(t), want), f"tensor {t}"


@pytest.mark.parametrize("remote", ["alloc", "reg"])
@pytest.mark.parametrize("local", ["alloc", "reg"])
def test_large_push_lands_every_byte_once(linked, remote, local):
    (tensors, blocks, bb, src, dst), peer, me, caches = linked
    _fill(caches[local], tensors, blocks, bb)
    assert peer.call(op="fill", which=remote) == {"ok": True}  # the peer's own pattern again
    me.push_kv_blocks(caches[local], kb.CacheIndex(1, peer.info[remote]), src, dst)
    for t in range(tensors):
        want = pattern(1, t, blocks, bb)
        want[dst] = pattern(2, t, blocks, bb)[src]
        got = read_process_memory(peer.info["pid"], peer.info["addrs"][remote][t], blocks * bb)
        assert np.array_equal(np.frombuffer(got, np.uint8).reshape(blocks, bb), want), f"tensor {t}"


def test_large_local_copy_lands_every_byte_once(linked):
    (tensors, blocks, bb, src, dst), _, me, caches = linked
    _fill(caches["alloc"], tensors, blocks, bb)
    for t in range(tensors):
        caches["reg"].numpy(t)[:] = pattern(3, t, blocks, bb)
    me.copy_kv_blocks(caches["alloc"], caches["reg"], src, [dst])
    for t in range(tensors):
        want = pattern(3, t, blocks, bb)
        want[dst] = pattern(2, t, blocks, bb)[src]
        assert np.array_equal(caches["reg"].numpy(t), want), f"tensor {t}"


@pytest.mark.parametrize("remote", ["alloc", "reg"])
def test_concurrent_large_pulls_have_landed_when_they_return(linked, remote):
    """Threads pulling at once share one copy pool (a caller that finds it busy copies alone). Each
    call's blocks are zeroed first and checked the moment it returns: a helper still copying after
    the return, or one that took another caller's chunks, shows as a wrong block."""
    (tensors, blocks, bb, _, _), peer, me, caches = linked
    local = caches["alloc"]
    threads = 4
    per = blocks // threads  # each thread owns dst blocks [k*per, (k+1)*per)
    if per * tensors * bb < 2 << 20:
        pytest.skip("calls under 2 MiB copy without the pool")
    assert peer.call(op="fill", which=remote) == {"ok": True}  # undo earlier pushes
    idx = kb.CacheIndex(1, peer.info[remote])
    errors = []

    def run(k):
        rng = np.random.default_rng(k)
        dst = list(range(k * per, (k + 1) * per))
        try:
            for _ in range(25):
                src = rng.choice(blocks, per, replace=False).tolist()
                for t in range(tensors):
                    local.numpy(t)[dst] = 0
                me.pull_kv_blocks(idx, local, src, dst)
                for t in range(tensors):
                    if not np.array_equal(local.numpy(t)[dst], pattern(1, t, blocks, bb)[src]):
                        errors.append(f"thread {k}, tensor {t}")
                        return
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: {e!r}")

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
