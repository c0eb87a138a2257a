# SPDX-License-Identifier: Apache-2.0
"""kvblocks.integrations.layouts and .completion with real engines: per-layer tensors described and
registered once under a key, compared field by field (and against the peer's real registration), and
block pulls finished through the runtime's async handles (a peer killed mid-way: a failed Finished)."""
import threading

import numpy as np
import pytest

import kvblocks as kb
from conftest import free_port
from kvblocks.integrations import layouts
from kvblocks.integrations.completion import Transfers
from kvblocks.integrations.layouts import Layout, diff
from kvblocks.integrations.peers import Peers, cache_key_of, cluster_id_of
from peer import pattern
from procs import Peer as Proc

KEY = cache_key_of("kv")


def kv(layers=3, blocks=6, shape=(2, 4, 8), dtype=np.float16, fill=0):
    return [np.full((blocks, *shape), fill + i, dtype=dtype) for i in range(layers)]


def test_describe_register_and_diff():
    arrays = kv()
    lay, addrs = layouts.describe_arrays(arrays, block_size=4, extra={"spec": "FullAttentionSpec"})
    assert (lay.num_layers, lay.num_blocks, lay.block_bytes, lay.dtype, lay.block_shape) == \
        (3, 6, 2 * 4 * 8 * 2, "float16", (2, 4, 8))
    assert Layout.from_dict(lay.to_dict()) == lay
    other, _ = layouts.describe_arrays(kv(blocks=9), block_size=4, extra={"spec": "FullAttentionSpec"})
    assert diff(lay, other) == [] and lay.digest() == other.digest()  # pool sizes may differ
    odd, _ = layouts.describe_arrays(kv(layers=2, shape=(2, 4, 16)), block_size=4)
    assert [(d.field, d.ours, d.theirs, d.transformable) for d in diff(lay, odd)] == [
        ("num_layers", 3, 2, False), ("block_bytes", 128, 256, False), ("block_shape", (2, 4, 8), (2, 4, 16), False),
        ("extra", (("spec", "FullAttentionSpec"),), (), False)]
    assert "block_shape: ours (2, 4, 8), theirs (2, 4, 16) (must match)" in layouts.explain(diff(lay, odd))
    dd = kb.LlmDataDist(1, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        reg = layouts.register(dd, lay, addrs, KEY, keepalive=arrays)
        assert reg.cache.cache_desc.num_tensors == 3 and reg.cache.num_blocks == 6
        assert np.array_equal(reg.cache.numpy(2).view(np.float16).reshape(6, 2, 4, 8), arrays[2])
        with pytest.raises(ValueError, match="2 tensor addresses for 3 layers"):
            layouts.register(dd, lay, addrs[:2])
    finally:
        dd.finalize()


def test_the_transform_hook_marks_what_can_be_bridged(monkeypatch):
    a, _ = layouts.describe_arrays(kv(shape=(2, 4, 8)))
    b, _ = layouts.describe_arrays(kv(shape=(4, 2, 8)))  # same bytes, other block shape
    assert [d.transformable for d in diff(a, b)] == [False]
    monkeypatch.setitem(layouts.TRANSFORMS, "block_shape", lambda x, y: sorted(x) == sorted(y))
    assert [(d.field, d.transformable) for d in diff(a, b)] == [("block_shape", True)]


def test_describe_refuses_what_cannot_be_one_cache():
    with pytest.raises(ValueError, match="layer 1 is"):
        layouts.describe_arrays([np.zeros((4, 8), np.float16), np.zeros((4, 9), np.float16)])
    with pytest.raises(ValueError, match="not contiguous"):
        layouts.describe_arrays([np.zeros((4, 8, 2), np.float16)[:, :, 0]])
    for bad in ({}, {"num_layers": "x"}, {"num_layers": 0, "num_blocks": 1, "block_bytes": 1, "dtype": "u8",
                                           "block_shape": []}):
        with pytest.raises(ValueError, match="malformed layout"):
            Layout.from_dict(bad)


def test_a_peer_layout_claim_is_checked_against_its_registration():
    """A peer whose params claim 4 layers of 64-byte blocks but registered 2 layers: the runtime's view
    of its cache says so (check_remote_cache), before any pull."""
    port = free_port()
    proc = Proc(cluster_id_of("p"), listen=f"127.0.0.1:{port}", tensors=2, blocks=8, block_bytes=64)
    dd = kb.LlmDataDist(cluster_id_of("d"), kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        cid = proc.call(op="alloc", name="kv", seed=3, key=KEY)["cache"]
        peers = Peers(dd)
        p = peers.get("p", "127.0.0.1", port)
        peers.ensure_linked(p)
        described = peers.describe_cache(p, peers.find_cache(p, KEY))
        assert described["cache_id"] == cid
        honest = Layout(2, 8, 64, "uint8", (64,))
        assert layouts.check_remote_cache(honest, described) == []
        liar = Layout(4, 8, 32, "uint8", (32,))
        assert [d.field for d in layouts.check_remote_cache(liar, described)] == ["num_layers", "block_bytes"]
    finally:
        dd.finalize()
        proc.close()


def test_pulls_complete_through_async_handles_without_python_threads():
    port = free_port()
    proc = Proc(cluster_id_of("p"), listen=f"127.0.0.1:{port}", tensors=2, blocks=8, block_bytes=4096,
                options={kb.OPTION_SYNC_CACHE_WAIT_TIME: "2000"})
    dd = kb.LlmDataDist(cluster_id_of("d"), kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "2000"})
    try:
        proc.call(op="alloc", name="kv", seed=5, key=KEY)
        local = dd.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_UINT8, [8, 4096]))
        peers = Peers(dd)
        p = peers.get("p", "127.0.0.1", port)
        peers.ensure_linked(p)
        idx = kb.CacheIndex(p.cluster_id, peers.find_cache(p, KEY))
        threads = threading.active_count()
        xs: Transfers[str] = Transfers()
        for i in range(8):
            xs.add(f"r{i}", dd.pull_kv_blocks_async(idx, local, [i], [7 - i]), f"ctx{i}")
        assert threading.active_count() == threads  # the runtime's pool moves the bytes
        done = xs.wait_all(10)
        assert sorted((f.key, f.context, f.ok) for f in done) == [(f"r{i}", f"ctx{i}", True) for i in range(8)]
        want = pattern(5, 1, 8, 4096)
        assert np.array_equal(local.numpy(1), want[::-1])
        with pytest.raises(ValueError, match="already in flight"):
            h = dd.pull_kv_blocks_async(idx, local, [0], [0])
            xs.add("again", h, "")
            xs.add("again", h, "")
        xs.wait_all(10)
        proc.close(kill=True)  # the peer dies: the next pull fails, as a Finished with ok=False
        try:
            xs.add("dead", dd.pull_kv_blocks_async(idx, local, [0], [0]), "ctx")
        except kb.LLMException:
            pass  # refused at submission (the runtime already dropped the link): the same outcome
        else:
            (f,) = xs.wait_all(5)
            assert not f.ok and "Error" in f.error
    finally:
        dd.finalize()
        proc.close()
