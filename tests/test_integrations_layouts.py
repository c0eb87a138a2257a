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


# ------------------------------------------------------------------ unequal layouts (compatible, plan)

def vcpu(layers, blocks, heads, tokens, dim=16, spec="FullAttentionSpec"):
    """A layout with vLLM's CPU interior: per KV head, K as [dim, tokens] then V as [tokens, dim], float16."""
    return Layout(layers, blocks, heads * 2 * tokens * dim * 2, "float16", (heads, 2, tokens, dim), tokens,
                  (("interior", "vllm-cpu"), ("spec", spec)))


def test_compatible_allows_what_kvblocks_transforms_and_explains_the_rest():
    a = vcpu(2, 8, 2, 32)
    assert layouts.compatible(a, vcpu(2, 99, 2, 32)).same  # pool sizes may differ
    c = layouts.compatible(a, vcpu(2, 8, 2, 64))
    assert c.ok and not c.same and (c.src.tokens, c.dst.tokens, c.src.heads) == (64, 32, 2)
    bad = layouts.compatible(a, vcpu(3, 8, 1, 64, spec="SlidingWindowSpec"))
    assert not bad.ok
    text = bad.explain()
    assert "num_layers: ours 2, theirs 3 (kvblocks maps layer l to layer l)" in text
    assert "spec: ours 'FullAttentionSpec', theirs 'SlidingWindowSpec' (must match)" in text
    assert "kv heads: ours 2, theirs 1 (a head slice needs the tensor-parallel ranks" in text
    assert layouts.compatible(vcpu(2, 8, 1, 32), a, [(1, 0, 1)]).ok  # decode TP=2 rank 1 of a TP=1 prefill
    assert "does not fit" in layouts.compatible(vcpu(2, 8, 1, 32), a, [(2, 0, 1)]).explain()
    assert "head_size: ours 16, theirs 32" in layouts.compatible(a, vcpu(2, 8, 2, 32, dim=32)).explain()
    opaque = Layout(2, 8, a.block_bytes * 2, "float16", (a.block_bytes,), 64, (("spec", "FullAttentionSpec"),))
    why = layouts.compatible(a, opaque).explain()
    assert "block_size: ours 32, theirs 64" in why and "(interior: ours 'vllm-cpu', theirs None)" in why


def kv_tokens(arrs, blocks, heads, dim):
    """[layer, head, K/V, token, dim] of the listed blocks in list order (the vllm-cpu interior)."""
    out = []
    for a in arrs:
        v = a.reshape(a.shape[0], heads, 2, -1)[list(blocks)]       # b, h, 2, t*dim
        t = v.shape[-1] // dim
        k = v[:, :, 0].reshape(len(blocks), heads, dim, t).transpose(0, 1, 3, 2)  # K is [dim, tokens]
        vv = v[:, :, 1].reshape(len(blocks), heads, t, dim)
        x = np.stack([k, vv], axis=2)                                   # b, h, 2, t, dim
        out.append(x.transpose(1, 2, 0, 3, 4).reshape(heads, 2, -1, dim))
    return np.stack(out)


def expect(got, dst, dst_blocks, d0, dh, src, src_blocks, s0, sh, start, stop, maps, sink, dim=16):
    """dst after moving tokens [start, stop) heads per maps (a numpy model of the vllm-cpu interior);
    where the plan may write garbage (tokens >= stop of the listed blocks, the sink) it takes ``got``."""
    want = [a.copy() for a in dst]
    xs = kv_tokens(src, src_blocks, sh, dim)
    for l, w in enumerate(want):
        v = w.reshape(w.shape[0], dh, 2, -1)
        td = v.shape[-1] // dim
        g = got[l].reshape(v.shape)
        for tok in range(start, stop):
            j, o = divmod(tok - d0, td)
            for s, d, n in maps:
                k = v[dst_blocks[j], d:d + n, 0].reshape(n, dim, td)
                k[:, :, o] = xs[l, s:s + n, 0, tok - s0]
                v[dst_blocks[j], d:d + n, 0] = k.reshape(n, -1)
                vv = v[dst_blocks[j], d:d + n, 1].reshape(n, td, dim)
                vv[:, o] = xs[l, s:s + n, 1, tok - s0]
                v[dst_blocks[j], d:d + n, 1] = vv.reshape(n, -1)
        for tok in range(stop, d0 + len(dst_blocks) * td):  # don't care: written before read
            j, o = divmod(tok - d0, td)
            kk, gk = v[dst_blocks[j], :, 0].reshape(dh, dim, td), g[dst_blocks[j], :, 0].reshape(dh, dim, td)
            kk[:, :, o] = gk[:, :, o]
            v[dst_blocks[j], :, 0] = kk.reshape(dh, -1)
            vv, gv = v[dst_blocks[j], :, 1].reshape(dh, td, dim), g[dst_blocks[j], :, 1].reshape(dh, td, dim)
            vv[:, o] = gv[:, o]
            v[dst_blocks[j], :, 1] = vv.reshape(dh, -1)
        v[sink] = g[sink]
    return want


def run_plan(dd, idx, cache, pieces):
    for pc in pieces:
        dd.prepare_transfer(idx, cache, list(pc.src_blocks), list(pc.dst_blocks), src_layout=pc.src_layout,
                            dst_layout=pc.dst_layout, src_heads=pc.src_heads, dst_heads=pc.dst_heads).execute()


def same(a, b):
    return all(np.array_equal(x.view(np.uint16), y.view(np.uint16)) for x, y in zip(a, b))


# (name, src tokens, src heads, dst tokens, dst heads, head maps, dst start (a prefix hit before), stop)
PLANS = [
    ("16->32", 16, 2, 32, 2, None, 0, 70),
    ("32->16 after a 16-token prefix hit", 32, 2, 16, 2, None, 16, 70),
    ("16->64 after a 64-token prefix hit, ends in a block", 16, 2, 64, 2, None, 64, 100),
    ("64->32 whole groups", 64, 2, 32, 2, None, 0, 128),
    ("TP1 -> TP2 rank 1 (head 1 of 2), 16->32", 16, 2, 32, 1, [(1, 0, 1)], 0, 70),
    ("TP1 -> TP2 rank 0, 32->16 after a hit", 32, 2, 16, 1, [(0, 0, 1)], 16, 50),
]
SINK = 12  # the destination's never-read block (vLLM's null block)


@pytest.mark.parametrize("case", PLANS, ids=[c[0] for c in PLANS])
def test_plan_moves_tokens_between_unequal_layouts_across_processes(case):
    """The prefill's cache in another process (random bytes), the decode's here: the plan's transfers
    land exactly the numpy model's bytes, and nothing else changes; a wrong head or block mapping fails."""
    _, ts, hs, td, hd, maps, d0, stop = case
    dim, layers, nb = 16, 2, 13
    src_g, dst_g = layouts.KvGeometry(ts, hs, dim, 2), layouts.KvGeometry(td, hd, dim, 2)
    port = free_port()
    proc = Proc(cluster_id_of("p"), listen=f"127.0.0.1:{port}", tensors=layers, blocks=nb,
                block_bytes=hs * 2 * ts * dim * 2)
    dd = kb.LlmDataDist(cluster_id_of("d"), kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        proc.call(op="alloc", name="kv", seed=7, key=KEY, random=True)
        rng = np.random.default_rng(7)
        src = [rng.integers(0, 256, (nb, hs * 2 * ts * dim * 2), dtype=np.uint8).view(np.float16)
               for _ in range(layers)]
        local = dd.allocate_cache(kb.CacheDesc(layers, kb.DataType.DT_FLOAT16, [nb, hd * 2 * td * dim]))
        before = [np.random.default_rng(l).standard_normal(local.numpy(l).shape).astype(np.float16)
                  for l in range(layers)]
        peers = Peers(dd)
        p = peers.get("p", "127.0.0.1", port)
        peers.ensure_linked(p)
        idx = kb.CacheIndex(p.cluster_id, peers.find_cache(p, KEY))
        src_blocks = [11, 3, 5, 0, 9, 2, 7, 8][:-(-stop // ts)]
        dst_blocks = [4, 10, 1, 6, 2, 11, 0][:-(-stop // td)][d0 // td:]
        maps_or_all = maps or [(0, 0, hs)]

        def attempt(sb, db, m):
            for l in range(layers):
                local.numpy(l)[:] = before[l]
            run_plan(dd, idx, local, layouts.plan(src_g, dst_g, sb, db, d0, stop, 0, d0, m, sink=SINK))
            got = [local.numpy(l).copy() for l in range(layers)]
            return got, expect(got, before, dst_blocks, d0, hd, src, src_blocks, 0, hs, d0, stop, maps_or_all, SINK)

        got, want = attempt(src_blocks, dst_blocks, maps)
        assert same(got, want)
        # negative controls: heads rotated (where there are two), blocks reversed
        if hd == hs == 2:
            assert not same(*attempt(src_blocks, dst_blocks, [(1, 0, 1), (0, 1, 1)]))
        assert not same(*attempt(src_blocks[::-1], dst_blocks, maps))
    finally:
        dd.finalize()
        proc.close()


def test_tp1_decode_pulls_two_halves_from_two_tp2_prefill_ranks():
    """Decode TP=1 (2 KV heads, 32-token blocks) from two TP=2 prefill ranks in two processes (1 head each,
    16-token blocks): one plan per rank, heads 0 and 1; swapping the ranks' heads is caught."""
    dim, layers, nb, ts, td, stop = 16, 2, 13, 16, 32, 75
    procs, idxs, srcs = [], [], []
    dd = kb.LlmDataDist(cluster_id_of("d"), kb.LlmRole.DECODER)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        peers = Peers(dd)
        for r in range(2):
            port = free_port()
            procs.append(Proc(cluster_id_of(f"p#tp{r}"), listen=f"127.0.0.1:{port}", tensors=layers, blocks=nb,
                              block_bytes=2 * ts * dim * 2))
            procs[-1].call(op="alloc", name="kv", seed=20 + r, key=KEY, random=True)
            rng = np.random.default_rng(20 + r)
            srcs.append([rng.integers(0, 256, (nb, 2 * ts * dim * 2), dtype=np.uint8).view(np.float16)
                         for _ in range(layers)])
            p = peers.get(f"p#tp{r}", "127.0.0.1", port)
            peers.ensure_linked(p)
            idxs.append(kb.CacheIndex(p.cluster_id, peers.find_cache(p, KEY)))
        local = dd.allocate_cache(kb.CacheDesc(layers, kb.DataType.DT_FLOAT16, [nb, 2 * 2 * td * dim]))
        src_g, dst_g = layouts.KvGeometry(ts, 1, dim, 2), layouts.KvGeometry(td, 2, dim, 2)
        sb, db = [3, 1, 4, 0, 5], [2, 7, 9]

        def attempt(order):
            for l in range(layers):
                local.numpy(l)[:] = 0
            for r, h in zip(range(2), order):
                run_plan(dd, idxs[r], local, layouts.plan(src_g, dst_g, sb, db, 0, stop, head_maps=[(0, h, 1)],
                                                          sink=SINK))
            got = [local.numpy(l).copy() for l in range(layers)]
            want = [np.zeros_like(g) for g in got]
            for r in range(2):
                want = expect(got, want, db, 0, 2, srcs[r], sb, 0, 1, 0, stop, [(0, r, 1)], SINK)
            return got, want

        assert same(*attempt((0, 1)))
        assert not same(*attempt((1, 0)))
    finally:
        dd.finalize()
        for pr in procs:
            pr.close()


def test_plan_refuses_ranges_outside_the_lists():
    g16, g32 = layouts.KvGeometry(16, 2, 16, 2), layouts.KvGeometry(32, 2, 16, 2)
    with pytest.raises(ValueError, match=r"tokens \[0, 70\) are not in both block lists"):
        layouts.plan(g16, g32, [0, 1, 2], [0, 1, 2], 0, 70)
    with pytest.raises(ValueError, match="block boundaries"):
        layouts.plan(g16, g32, [0], [0], 8, 16, src_token0=8)
    with pytest.raises(ValueError, match="does not fit"):
        layouts.plan(g16, g32, [0], [0], 0, 16, head_maps=[(1, 1, 2)])
    with pytest.raises(ValueError, match="a sink block is needed"):
        layouts.plan(g32, g16, [0], [0], 0, 10)  # 32 source tokens, one 16-token destination block
    assert len(layouts.plan(g16, g32, [0, 1, 2, 3], [5, 6], 0, 64)) == 4  # K and V of 2 heads, no sink


def test_tp_sources_split_heads_between_ranks():
    """Which prefill ranks a decode rank pulls from, which heads, and how many decode ranks pull from
    each prefill rank (its done count); swap (the negative control) mirrors the ranks."""
    RS = layouts.RankSource
    assert layouts.tp_sources(1, 2, 1, 0, 2) == [RS(0, None, 1)]
    assert layouts.tp_sources(2, 1, 2, 1, 1) == [RS(1, None, 1)]
    # decode TP=1 from prefill TP=2: head 0 of rank 0 -> head 0, head 0 of rank 1 -> head 1, one puller each
    assert layouts.tp_sources(2, 1, 1, 0, 2) == [RS(0, ((0, 0, 1),), 1), RS(1, ((0, 1, 1),), 1)]
    assert layouts.tp_sources(2, 1, 1, 0, 2, swap=True) == [RS(1, ((0, 0, 1),), 1), RS(0, ((0, 1, 1),), 1)]
    # decode TP=2 from prefill TP=1: rank 1 takes head 1 into its head 0; two decode ranks pull from rank 0
    assert layouts.tp_sources(1, 2, 2, 1, 1) == [RS(0, ((1, 0, 1),), 2)]
    assert layouts.tp_sources(1, 2, 2, 1, 1, swap=True) == [RS(0, ((0, 0, 1),), 2)]
    # TP 4 -> 2 (8 heads): decode rank 1 holds heads 4..7 = prefill ranks 2 and 3
    assert layouts.tp_sources(4, 2, 2, 1, 4) == [RS(2, ((0, 0, 2),), 1), RS(3, ((0, 2, 2),), 1)]
    # TP 2 -> 4: decode rank 3 holds heads 6, 7 = prefill rank 1's heads 2, 3
    assert layouts.tp_sources(2, 4, 4, 3, 2) == [RS(1, ((2, 0, 2),), 2)]
    with pytest.raises(ValueError, match="replicated KV heads"):
        layouts.tp_sources(4, 1, 1, 0, 2)  # 4 ranks x 1 head (replicated) against 2 heads
    with pytest.raises(ValueError, match="positive"):
        layouts.tp_sources(2, 1, 1, 1, 2)
