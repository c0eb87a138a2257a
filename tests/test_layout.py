# SPDX-License-Identifier: Apache-2.0
"""Layout transforms (README "Layout transforms"): random shapes, NHD/HND, head ranges, block-size
ratios and block lists, pulled and pushed on every path (inprocess, shm, cma, tcp; ucx where the
ucx extra is installed), byte for byte against a numpy model of the transform written from the
README's rules, not from plan/layout.cc. Rejected calls must leave both sides unchanged.

The ucx rows skip without the ucx extra; with it (e.g. the UCX venv, KVBLOCKS_UCX_PLUGIN naming its
libkvblocks_ucx.so) they run over UCX_TLS=tcp unless UCX_TLS is set."""
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvblocks as kb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Pair, cluster, free_port  # noqa: E402
from procs import Peer  # noqa: E402
from ucx_env import ucx_available  # noqa: E402

NT = 2          # tensors per cache
RB, RNB = 2048, 16                     # remote block bytes and blocks
LOCAL_BB = (512, 1024, 2048, 4096, 8192)
LNB = 8                                # local blocks per cache
SETTINGS = settings(max_examples=int(os.environ.get("KVB_LAYOUT_EXAMPLES", "25")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------- the model
def tokens(blocks_bytes, layout, heads):
    """[tensor, token, head, bytes] of the listed blocks, in list order, heads [a, b) only."""
    t, h, d, e, order = layout
    x = blocks_bytes.reshape(blocks_bytes.shape[0], blocks_bytes.shape[1], *((h, t) if order == "HND" else (t, h)),
                             d * e)
    if order == "HND":
        x = x.transpose(0, 1, 3, 2, 4)
    x = x.reshape(x.shape[0], -1, h, d * e)
    return x[:, :, heads[0]:heads[1]]


def model(src, dst, src_blocks, dst_blocks, sl, dl, sh, dh):
    """dst after the transform (dst's unlisted blocks and heads unchanged)."""
    want = dst.copy()
    tok = tokens(src[:, src_blocks], sl, sh)
    t, h, d, e, order = dl
    for j, b in enumerate(dst_blocks):
        shape = (NT, h, t, d * e) if order == "HND" else (NT, t, h, d * e)
        blk = want[:, b].reshape(shape)
        part = tok[:, j * t:(j + 1) * t]
        if order == "HND":
            blk[:, dh[0]:dh[1]] = part.transpose(0, 2, 1, 3)
        else:
            blk[:, :, dh[0]:dh[1]] = part
        want[:, b] = blk.reshape(NT, -1)
    return want


def pow2_divisors(n):
    return [1 << i for i in range(n.bit_length()) if n % (1 << i) == 0]


@st.composite
def transforms(draw):
    """(local block bytes, remote layout, local layout, remote heads, local heads, remote list, local list)."""
    elem = draw(st.sampled_from([1, 2, 4]))
    chunk = draw(st.sampled_from([16, 32, 64, 128, 256]))
    d = chunk // elem
    lbb = draw(st.sampled_from(LOCAL_BB))
    rt = draw(st.sampled_from(pow2_divisors(RB // chunk)))
    lt = draw(st.sampled_from([t for t in pow2_divisors(lbb // chunk) if t * 8 >= rt and rt * 8 >= t]))
    rl = (rt, RB // chunk // rt, d, elem, draw(st.sampled_from(["NHD", "HND"])))
    ll = (lt, lbb // chunk // lt, d, elem, draw(st.sampled_from(["NHD", "HND"])))
    n = draw(st.integers(1, min(rl[1], ll[1])))
    a = draw(st.integers(0, rl[1] - n))
    c = draw(st.integers(0, ll[1] - n))
    # Token counts that tile: lcm-sized groups of each side's blocks.
    lcm = int(np.lcm(rt, lt))
    groups = draw(st.integers(1, max(1, min(RNB * rt, LNB * lt) // lcm)))
    nr, nl = groups * lcm // rt, groups * lcm // lt
    if nr > RNB or nl > LNB:
        nr, nl = lcm // rt, lcm // lt
    remote = draw(st.lists(st.integers(0, RNB - 1), min_size=nr, max_size=nr))
    local = draw(st.permutations(range(LNB)))[:nl]  # unique: a repeated destination block has no order
    return lbb, rl, ll, (a, a + n), (c, c + n), remote, list(local)


def kb_layout(l):
    return kb.BlockLayout(*l)


# ---------------------------------------------------------------- the paths
class Side:
    """`me` (cluster 2) linked to a remote cache of RNB x RB bytes with known random contents, and
    local caches of every LOCAL_BB."""

    def __init__(self, me, remote_id, close):
        self.me, self.remote_id, self.close = me, remote_id, close
        rng = np.random.default_rng(29)
        self.rdata = rng.integers(0, 256, (NT, RNB, RB), dtype=np.uint8)
        self.orig = me.register_arrays([self.rdata[t].copy() for t in range(NT)])
        self.scratch = np.zeros((NT, RNB, RB), np.uint8)
        self.scratch_cache = me.register_arrays([self.scratch[t] for t in range(NT)])
        self.local = {bb: np.zeros((NT, LNB, bb), np.uint8) for bb in LOCAL_BB}
        self.lcache = {bb: me.register_arrays([a[t] for t in range(NT)]) for bb, a in self.local.items()}
        self.restore()

    def idx(self):
        return kb.CacheIndex(1, self.remote_id)

    def restore(self):
        self.me.push_kv_blocks(self.orig, self.idx(), list(range(RNB)), list(range(RNB)))

    def remote_now(self):
        self.me.pull_kv_blocks(self.idx(), self.scratch_cache, list(range(RNB)), list(range(RNB)))
        return self.scratch.copy()


def _peer_side(transport, remote, options=None):
    port = free_port()
    opts = dict(options or {})
    peer = Peer(1, listen=f"127.0.0.1:{port}", transport=transport, tensors=NT, blocks=RNB, block_bytes=RB,
                options=opts)
    me = kb.LlmDataDist(2, kb.LlmRole.MIX)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: transport, **opts})
    assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]

    def close():
        me.finalize()
        peer.close()
    return me, peer.info[remote], close


PATHS = ["inprocess", "shm", "cma", "tcp", "ucx"]
WANT_PATH = {"inprocess": "inprocess", "shm": "shm+cma", "cma": "shm+cma", "tcp": "tcp", "ucx": "ucx"}


@pytest.fixture(scope="module", params=PATHS)
def side(request):
    path = request.param
    if path == "inprocess":
        pair = Pair(role_p=kb.LlmRole.MIX, role_d=kb.LlmRole.MIX)
        arrays = [np.zeros((RNB, RB), np.uint8) for _ in range(NT)]
        rc = pair.p.register_arrays(arrays)
        pair.link()
        s = Side(pair.d, rc.cache_id, pair.close)
    elif path == "ucx":
        if not ucx_available():
            pytest.skip("the ucx extra (kvblocks-ucx) is not installed")
        os.environ.setdefault("UCX_TLS", "tcp")
        s = Side(*_peer_side("ucx", "alloc", {kb.OPTION_UCX_TRUSTED_NETWORK: "1"}))
    else:
        s = Side(*_peer_side("tcp" if path == "tcp" else "auto", "reg" if path == "cma" else "alloc"))
    assert s.me.link_path(1) == WANT_PATH[path]
    s.path = path
    yield s
    s.close()


# ---------------------------------------------------------------- properties
@SETTINGS
@given(x=transforms())
def test_pull_transform_matches_model(side, x):
    lbb, rl, ll, rh, lh, remote, local = x
    dst = side.local[lbb]
    dst[...] = np.random.default_rng(len(remote)).integers(0, 256, dst.shape, dtype=np.uint8)
    before = dst.copy()
    side.me.pull_kv_blocks_layout(side.idx(), side.lcache[lbb], remote, local, kb_layout(rl), kb_layout(ll),
                                  src_heads=rh, dst_heads=lh)
    np.testing.assert_array_equal(dst, model(side.rdata, before, remote, local, rl, ll, rh, lh))


@SETTINGS
@given(x=transforms())
def test_push_transform_matches_model(side, x):
    lbb, rl, ll, rh, lh, remote, local = x
    src = side.local[lbb]
    src[...] = np.random.default_rng(len(local)).integers(0, 256, src.shape, dtype=np.uint8)
    # The local list is the source here: its blocks tile the remote list; remote blocks unique.
    remote = list(dict.fromkeys(remote))
    if len(remote) * rl[0] != len(local) * ll[0]:
        remote = list(range(len(local) * ll[0] // rl[0]))
    try:
        side.me.push_kv_blocks_layout(side.lcache[lbb], side.idx(), local, remote, kb_layout(ll), kb_layout(rl),
                                      src_heads=lh, dst_heads=rh)
        got = side.remote_now()
        np.testing.assert_array_equal(got, model(src, side.rdata, local, remote, ll, rl, lh, rh))
    finally:
        side.restore()


@SETTINGS
@given(x=transforms(), breaks=st.sampled_from(["tiling", "heads", "bytes", "elem", "range"]))
def test_broken_transform_is_refused_and_moves_nothing(side, x, breaks):
    lbb, rl, ll, rh, lh, remote, local = x
    dst = side.local[lbb]
    dst[...] = 3
    if breaks == "tiling":
        remote = remote + [0]
    elif breaks == "heads":  # the destination range runs one head past the layout's
        lh = (ll[1] - (lh[1] - lh[0]) + 1, ll[1] + 1)
    elif breaks == "bytes":  # the layout no longer describes the cache's blocks
        ll = (ll[0], ll[1], ll[2] * 2, ll[3], ll[4])
    elif breaks == "elem":  # same bytes per head, another element size
        ll = (ll[0], ll[1], ll[2] // 2, ll[3] * 2, ll[4])
    else:
        remote = remote[:-1] + [RNB]
    with pytest.raises(kb.ParamInvalidError):
        side.me.pull_kv_blocks_layout(side.idx(), side.lcache[lbb], remote, local, kb_layout(rl), kb_layout(ll),
                                      src_heads=rh, dst_heads=lh)
    assert (dst == 3).all()


def test_prepared_transfer_runs_many_times(side):
    """Planned once, executed after the source changed: each execution moves the current bytes."""
    rl, ll = (8, 2, 32, 4, "NHD"), (16, 1, 32, 4, "HND")  # 2048 and 2048 bytes
    p = side.me.prepare_transfer(side.idx(), side.lcache[2048], [0, 1, 2, 3], [5, 6], src_layout=kb_layout(rl),
                                 dst_layout=kb_layout(ll), src_heads=(1, 2), dst_heads=(0, 1))
    assert p.pairs == NT and p.bytes == NT * 2 * 2048 // 1
    for _ in range(3):
        side.local[2048][...] = 0
        p.execute()
        want = model(side.rdata, np.zeros_like(side.local[2048]), [0, 1, 2, 3], [5, 6], rl, ll, (1, 2), (0, 1))
        np.testing.assert_array_equal(side.local[2048], want)
    side.local[2048][...] = 0
    p.execute_async().wait()
    np.testing.assert_array_equal(side.local[2048], want)


def test_negative_control_wrong_stride_is_caught(side):
    """The model with a deliberately wrong stride (the source's heads read as if it had one more
    token per block) disagrees with what the runtime moved: the property tests can see such a bug."""
    rl, ll = (8, 4, 16, 4, "HND"), (8, 4, 16, 4, "NHD")
    lbb = 2048
    side.local[lbb][...] = 0
    side.me.pull_kv_blocks_layout(side.idx(), side.lcache[lbb], [2, 3], [0, 1], kb_layout(rl), kb_layout(ll))
    got = side.local[lbb].copy()
    np.testing.assert_array_equal(got, model(side.rdata, np.zeros_like(got), [2, 3], [0, 1], rl, ll, (0, 4), (0, 4)))
    wrong = side.rdata.reshape(NT, RNB, -1)
    flat = wrong.reshape(NT, -1)
    skewed = np.stack([np.roll(flat[t], -64) for t in range(NT)]).reshape(wrong.shape)  # off by one 64-byte chunk
    assert not np.array_equal(got, model(skewed, np.zeros_like(got), [2, 3], [0, 1], rl, ll, (0, 4), (0, 4)))
