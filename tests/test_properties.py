# SPDX-License-Identifier: Apache-2.0
"""Property tests: random block lists and layer ranges against a pure-numpy reference model.

The model is written from the spec's semantics (layers of ``tnpl`` consecutive tensors,
inclusive C++ ranges, (-1,-1) = all, kvblocks' [REC] bounds rules) rather than from the
runtime's code. For every call it predicts accept/reject and the resulting bytes; every rejected
call must leave both caches unchanged (kvblocks validates everything before moving a byte).
"""
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pair  # noqa: E402
from test_spec_pull import make_arrays, register  # noqa: E402

S = kb.Status
NB = 4  # blocks per cache
# KVB_PROPERTY_EXAMPLES: fewer under the sanitizers (.ci/run), where each example costs several times more
EXAMPLES = int(os.environ.get("KVB_PROPERTY_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MORE = settings(SETTINGS, max_examples=EXAMPLES * 10 // 3)


class World:
    """P (cluster 1) and D (cluster 2), each with a 10-tensor and a 6-tensor INT32 [4,16] cache."""

    def __init__(self):
        self.pair = Pair()
        self.p, self.d = self.pair.p, self.pair.d
        self.pa = {n: make_arrays(n, (NB, 16), +1) for n in (10, 6)}
        self.da = {n: make_arrays(n, (NB, 16), -1) for n in (10, 6)}
        self.p0 = {n: a.copy() for n, a in self.pa.items()}
        self.d0 = {n: a.copy() for n, a in self.da.items()}
        self.pc = {n: register(self.p, a) for n, a in self.pa.items()}
        self.dc = {n: register(self.d, a) for n, a in self.da.items()}
        self.pair.link()
        # Local copy targets on D (allocated, runtime-owned memory).
        self.xc = {n: self.d.allocate_cache(kb.CacheDesc(n, kb.DataType.DT_INT32, [NB, 16])) for n in (10, 6)}
        self.xa = {n: np.stack([self.xc[n].numpy(t) for t in range(n)]) for n in (10, 6)}

    def reset(self):
        for n in (10, 6):
            self.pa[n][...] = self.p0[n]
            self.da[n][...] = self.d0[n]
            for t in range(n):
                self.xc[n].numpy(t)[...] = 7 * t

    def snapshot(self):
        return {n: a.copy() for n, a in self.pa.items()}, {n: a.copy() for n, a in self.da.items()}

    def assert_state(self, p_want, d_want):
        for n in (10, 6):
            np.testing.assert_array_equal(self.pa[n], p_want[n])
            np.testing.assert_array_equal(self.da[n], d_want[n])


@pytest.fixture(scope="module")
def world():
    w = World()
    yield w
    w.pair.close()


# ---------------------------------------------------------------- strategies
index = st.sampled_from([0, 1, 2, 3] * 5 + [NB])  # NB itself is out of range (rarely drawn)
layer = st.integers(-2, 6)
ranges = st.one_of(st.just((-1, -1)), st.tuples(layer, layer))
tnpls = st.sampled_from([0, 1, 1, 2, 2, 2, 2, 3, 5, 7, 10, 11])
sizes = st.sampled_from([10, 10, 10, 6])


@st.composite
def block_pairs(draw):
    """(src, dst): mostly equal lengths, sometimes empty or unequal."""
    n = draw(st.integers(0, 5))
    m = max(0, n + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1])))
    return draw(st.lists(index, min_size=n, max_size=n)), draw(st.lists(index, min_size=m, max_size=m))


@st.composite
def copy_args(draw):
    """(src_blocks, dst_blocks_list) for copy_kv_blocks: 0-3 lists, mostly of src's length."""
    n = draw(st.integers(0, 4))
    src = draw(st.lists(index, min_size=n, max_size=n))
    lists = []
    for _ in range(draw(st.integers(0, 3))):
        m = max(0, n + draw(st.sampled_from([0, 0, 0, 0, 1, -1])))
        lists.append(draw(st.lists(index, min_size=m, max_size=m)))
    return src, lists


@st.composite
def layer_ranges(draw, tnpl):
    """(src_range, dst_range): all layers, equal-width explicit ranges near the last layer of a
    10-tensor cache at this tnpl, or anything."""
    kind = draw(st.sampled_from(["all", "equal", "equal", "any"]))
    if kind == "all":
        return (-1, -1), (-1, -1)
    if kind == "equal":
        last = max(1, 10 // max(tnpl, 1))
        w = draw(st.sampled_from([0, 0, 1, 2, 4]))
        near = st.one_of(st.integers(-1, last), st.sampled_from([last - w - 1, last - w, last]))
        a, b = draw(near), draw(near)
        return (a, a + w), (b, b + w)
    return draw(ranges), draw(ranges)


def _valid_range(r):
    return r[0] >= -1 and r[1] >= -1 and r[0] <= r[1]


# ---------------------------------------------------------------- reference model
def model_pull(src, dst, sr, dr, tnpl, rnt, lnt):
    """Tensor pairs (remote, local) for a pull, or None when the call must be rejected."""
    if not src or len(src) != len(dst):
        return None
    if not (_valid_range(sr) and _valid_range(dr)) or tnpl < 1:
        return None
    if sr[0] >= 0 and dr[0] >= 0:  # explicit ranges apply only when both firsts are >= 0
        if lnt % tnpl:
            return None
        s_t = list(range(sr[0] * tnpl, (sr[1] + 1) * tnpl))
        d_t = list(range(dr[0] * tnpl, (dr[1] + 1) * tnpl))
        if len(s_t) != len(d_t) or d_t[-1] >= lnt or s_t[-1] >= rnt:
            return None
        pairs = list(zip(s_t, d_t))
    else:
        if rnt != lnt:
            return None
        pairs = [(t, t) for t in range(lnt)]
    if max(dst) >= NB or max(src) >= NB:
        return None
    return pairs


def model_push(src, dst, sr, dr, tnpl, lnt, rnt):
    """Tensor pairs (local, remote) for a push, or None when the call must be rejected."""
    if not src or len(src) != len(dst):
        return None
    if not (_valid_range(sr) and _valid_range(dr)) or sr[1] - sr[0] != dr[1] - dr[0] or tnpl < 1:
        return None
    if lnt % tnpl:
        return None
    if sr[0] < 0:
        layers = [(l, l) for l in range(lnt // tnpl)]
    else:
        layers = [(sr[0] + i, dr[0] + i) for i in range(sr[1] - sr[0] + 1)]
    for s_l, d_l in layers:
        if s_l >= lnt // tnpl or d_l < 0 or d_l >= rnt // tnpl:
            return None
    if max(dst) >= NB or max(src) >= NB:
        return None
    return [(s_l * tnpl + j, d_l * tnpl + j) for s_l, d_l in layers for j in range(tnpl)]


def apply(src_arr, dst_arr, tensor_pairs, src, dst):
    """Expected destination: for duplicate destinations any of the candidate sources may win."""
    want = dst_arr.copy()
    candidates = {}
    for s, d in zip(src, dst):
        candidates.setdefault(d, []).append(s)
    for st_, dt in tensor_pairs:
        for d, ss in candidates.items():
            want[dt, d] = src_arr[st_, ss[-1]]
    return want, candidates


def check_blocks(actual, src_arr, tensor_pairs, candidates):
    for st_, dt in tensor_pairs:
        for d, ss in candidates.items():
            assert any(np.array_equal(actual[dt, d], src_arr[st_, s]) for s in ss)


def run_and_check(world, fn, pairs, src_side, dst_side, src, dst):
    """Calls fn; checks the status and the bytes against the model. src_side/dst_side: (dict, n)."""
    p_before, d_before = world.snapshot()
    (s_map, s_n), (d_map, d_n) = src_side, dst_side
    event("rejected" if pairs is None else "accepted")
    if pairs is None:
        with pytest.raises(kb.LLMException) as ei:
            fn()
        assert ei.value.status_code == S.LLM_PARAM_INVALID
        world.assert_state(p_before, d_before)  # a rejected call changes nothing
        return False
    src_arr = s_map[s_n].copy()
    want, candidates = apply(src_arr, d_map[d_n], pairs, src, dst)
    fn()
    touched = {(dt, d) for _, dt in pairs for d in candidates}
    actual = d_map[d_n]
    check_blocks(actual, src_arr, pairs, candidates)
    mask = np.ones(actual.shape[:2], bool)
    for dt, d in touched:
        mask[dt, d] = False
    np.testing.assert_array_equal(actual[mask], want[mask])  # nothing else moved
    # Every other cache is unchanged.
    for side, before in ((world.pa, p_before), (world.da, d_before)):
        for n in (10, 6):
            if side[n] is not actual:
                np.testing.assert_array_equal(side[n], before[n])
    return True


# ---------------------------------------------------------------- properties
@MORE
@given(blocks_=block_pairs(), tnpl_ranges=tnpls.flatmap(lambda t: st.tuples(st.just(t), layer_ranges(t))),
       rn=sizes, ln=sizes)
@example(blocks_=([0], [0]), tnpl_ranges=(2, ((3, 3), (0, 0))), rn=6, ln=10)  # src layer past the peer
@example(blocks_=([1, 2], [3, 0]), tnpl_ranges=(2, ((-1, -1), (-1, -1))), rn=6, ln=10)  # tensor counts differ
def test_pull_matches_model(world, blocks_, tnpl_ranges, rn, ln):
    (src, dst), (tnpl, (sr, dr)) = blocks_, tnpl_ranges
    world.reset()
    pairs = model_pull(src, dst, sr, dr, tnpl, rn, ln)
    ext = kb.KvCacheExtParam(sr, dr, tnpl)
    idx = kb.CacheIndex(1, world.pc[rn].cache_id)
    run_and_check(world, lambda: world.d.pull_kv_blocks(idx, world.dc[ln], src, dst, ext), pairs,
                  (world.pa, rn), (world.da, ln), src, dst)


@MORE
@given(blocks_=block_pairs(), tnpl_ranges=tnpls.flatmap(lambda t: st.tuples(st.just(t), layer_ranges(t))),
       ln=sizes, rn=sizes)
@example(blocks_=([0], [0]), tnpl_ranges=(2, ((5, 5), (0, 0))), ln=10, rn=10)  # src layer past the end
@example(blocks_=([0], [0]), tnpl_ranges=(2, ((4, 4), (3, 3))), ln=10, rn=6)  # dst layer past the peer
def test_push_matches_model(world, blocks_, tnpl_ranges, ln, rn):
    (src, dst), (tnpl, (sr, dr)) = blocks_, tnpl_ranges
    world.reset()
    pairs = model_push(src, dst, sr, dr, tnpl, ln, rn)
    ext = kb.KvCacheExtParam(sr, dr, tnpl)
    idx = kb.CacheIndex(2, world.dc[rn].cache_id)
    run_and_check(world, lambda: world.p.push_kv_blocks(world.pc[ln], idx, src, dst, ext), pairs,
                  (world.pa, ln), (world.da, rn), src, dst)


@SETTINGS
@given(data=st.data())
def test_valid_pulls_match_model(world, data):
    # Biased to accepted calls: unique in-range destinations, equal lengths, explicit ranges.
    world.reset()
    n = data.draw(st.integers(1, NB))
    dst = data.draw(st.permutations(range(NB)))[:n]
    src = data.draw(st.lists(st.integers(0, NB - 1), min_size=n, max_size=n))
    tnpl = data.draw(st.sampled_from([1, 2, 5, 10]))
    layers = 10 // tnpl
    w = data.draw(st.integers(1, layers))
    s0 = data.draw(st.integers(0, layers - w))
    d0 = data.draw(st.integers(0, layers - w))
    sr, dr = (s0, s0 + w - 1), (d0, d0 + w - 1)
    pairs = model_pull(src, dst, sr, dr, tnpl, 10, 10)
    assert pairs is not None
    idx = kb.CacheIndex(1, world.pc[10].cache_id)
    ext = kb.KvCacheExtParam(sr, dr, tnpl)
    assert run_and_check(world, lambda: world.d.pull_kv_blocks(idx, world.dc[10], src, dst, ext), pairs,
                         (world.pa, 10), (world.da, 10), src, dst)


@SETTINGS
@given(data=st.data())
def test_valid_pushes_match_model(world, data):
    world.reset()
    n = data.draw(st.integers(1, NB))
    dst = data.draw(st.permutations(range(NB)))[:n]
    src = data.draw(st.lists(st.integers(0, NB - 1), min_size=n, max_size=n))
    tnpl = data.draw(st.sampled_from([1, 2, 5, 10]))
    layers = 10 // tnpl
    w = data.draw(st.integers(1, layers))
    s0 = data.draw(st.integers(0, layers - w))
    d0 = data.draw(st.integers(0, layers - w))
    sr, dr = (s0, s0 + w - 1), (d0, d0 + w - 1)
    pairs = model_push(src, dst, sr, dr, tnpl, 10, 10)
    assert pairs is not None
    idx = kb.CacheIndex(2, world.dc[10].cache_id)
    ext = kb.KvCacheExtParam(sr, dr, tnpl)
    assert run_and_check(world, lambda: world.p.push_kv_blocks(world.pc[10], idx, src, dst, ext), pairs,
                         (world.pa, 10), (world.da, 10), src, dst)


def _x(world, n):
    return np.stack([world.xc[n].numpy(t).copy() for t in range(n)])


@SETTINGS
@given(args=copy_args(), sn=sizes, dn=sizes)
def test_copy_blocks_matches_model(world, args, sn, dn):
    # V1 CopyKvBlocks rules, in D's process: one source list to several destination lists,
    # from D's registered cache into an allocated one.
    src, lists = args
    world.reset()
    ok = bool(src) and bool(lists) and sn == dn and all(len(l) == len(src) for l in lists) and \
        max(src, default=0) < NB and all(max(l, default=0) < NB for l in lists)
    event("accepted" if ok else "rejected")
    p_before, d_before = world.snapshot()
    x_before = {n: _x(world, n) for n in (10, 6)}
    if not ok:
        with pytest.raises(kb.LLMException) as ei:
            world.d.copy_kv_blocks(world.dc[sn], world.xc[dn], src, lists)
        assert ei.value.status_code == S.LLM_PARAM_INVALID
        world.assert_state(p_before, d_before)
        for n in (10, 6):
            np.testing.assert_array_equal(_x(world, n), x_before[n])
        return
    want = x_before[dn].copy()
    for l in lists:
        for s, d in zip(src, l):
            want[:, d] = d_before[sn][:, s]
    # With duplicate destinations (within or across lists) the last copy wins; only check
    # uniquely written blocks exactly, and that the others hold one of their sources.
    written = [d for l in lists for d in l]
    world.d.copy_kv_blocks(world.dc[sn], world.xc[dn], src, lists)
    got = _x(world, dn)
    for d in range(NB):
        if written.count(d) <= 1:
            np.testing.assert_array_equal(got[:, d], want[:, d])
        else:
            sources = [s for l in lists for s, dd in zip(src, l) if dd == d]
            assert any(np.array_equal(got[:, d], d_before[sn][:, s]) for s in sources)
    world.assert_state(p_before, d_before)
