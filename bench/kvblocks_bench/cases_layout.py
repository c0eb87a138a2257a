# SPDX-License-Identifier: Apache-2.0
"""Layout transforms and prepared transfers (group ``layout``, README "Layout transforms").

* ``layout/{shm,cma,tcp}/{64,256}MiB/transform``: a pull from a prefill-shaped cache (16 tokens x 8
  heads x 256-byte head chunks, NHD) into a decode-shaped one (32 tokens x 4 heads, HND): heads
  [0, 4) only, two source blocks per destination block, NHD -> HND; planned in the call.
  ``.../prepared``: the same, planned once (PreparedTransfer.execute). ``.../heads``: the head slice
  alone (heads [0, 4) of 8 into heads [0, 4) of the same NHD layout: half of every block, 1 KiB of
  every 2 KiB on both sides); ``.../nhd-hnd``: the conversion alone (every head, 16 tokens, NHD ->
  HND). All beside ``.../plain``: an untransformed pull of the same byte count on the same path.
  (Block ratio 2 alone, NHD and every head, is whole source blocks into halves of destination
  blocks: ranges as long as a plain pull's.)
* ``layout/{shm,cma}/pairs-655360/prepared``: 80 layers x 2 tensors x 4,096 blocks of 256 bytes, no
  two blocks adjacent (655,360 block-tensor pairs), planned once; beside ``.../contiguous``: the same
  bytes in one contiguous range per tensor. (prepared - contiguous) / 655,360 is the overhead per pair.
* ``layout/pairs-655360/numpy-{contiguous,strided}``: the same two copies by numpy in this process
  (one thread), timed in the prepared case's rounds: (strided - contiguous) / 655,360 is what the
  shape itself costs per pair (every other 256-byte block of memory), so the prepared plan's
  overhead beyond the copy is its own per-pair figure minus this one.
* ``layout/plan/{80x2x4096,61x1x8192}``: prepare_transfer of that many pairs (block lists as
  numpy arrays), beside nothing: compare with the time the same path takes to move 1 GiB.
"""
from __future__ import annotations

from .common import KiB, MiB, Case
from .common import np as _np

CHUNK = 256                     # bytes of one head of one token: head_size 128 x 2 bytes
SRC = (16, 8, 128, 2, "NHD")    # prefill: 16 tokens, 8 heads
DST = (32, 4, 128, 2, "HND")    # decode: 32 tokens, 4 heads (TP 2), heads [0, 4) of the prefill's
BB = 16 * 8 * CHUNK             # 32 KiB: the same block bytes on both sides
NT = 2


def _layouts():
    import kvblocks as kb
    return kb.BlockLayout(*SRC), kb.BlockLayout(*DST)


def _nd(size):
    return size // (NT * BB)  # destination blocks per call; the source reads half of twice as many


def _transfer_case(path, size, variant):
    nd = _nd(size)

    def make(h):
        p = h.pair(path, NT, 2 * nd, BB)
        src, dst = _np().arange(2 * nd, dtype=_np().uint64), _np().arange(nd, dtype=_np().uint64)
        if variant == "plain":
            return (lambda: p.dd.pull_kv_blocks(p.index, p.cache, dst, dst)), None
        sl, dl = _layouts()
        if variant == "heads":
            ids = _np().arange(2 * nd, dtype=_np().uint64)  # half of each of 2 nd blocks
            return (lambda: p.dd.pull_kv_blocks_layout(p.index, p.cache, ids, ids, sl, sl, (0, 4), (0, 4))), None
        if variant == "nhd-hnd":
            import kvblocks as kb
            hl = kb.BlockLayout(SRC[0], SRC[1], SRC[2], SRC[3], "HND")
            return (lambda: p.dd.pull_kv_blocks_layout(p.index, p.cache, dst, dst, sl, hl)), None
        if variant == "transform":
            return (lambda: p.dd.pull_kv_blocks_layout(p.index, p.cache, src, dst, sl, dl, (0, 4), (0, 4))), None
        prep = p.dd.prepare_transfer(p.index, p.cache, src, dst, src_layout=sl, dst_layout=dl, src_heads=(0, 4),
                                     dst_heads=(0, 4))
        return prep.execute, None

    base = None if variant == "plain" else f"layout/{path}/{size // MiB}MiB/plain"
    note = {"plain": f"pull_kv_blocks of {nd} whole blocks x {NT} tensors",
            "transform": "heads [0,4) of 8, 16->32 tokens, NHD->HND, planned in the call",
            "prepared": "the same transform, planned once",
            "heads": "heads [0,4) of 8 into [0,4) of 8, NHD both sides, planned in the call",
            "nhd-hnd": "every head, 16 tokens, NHD->HND, planned in the call"}[variant]
    return Case(f"layout/{path}/{size // MiB}MiB/{variant}", "layout", make, baseline=base, bytes=size,
                blocks=NT * nd, reps="large", path=path, pgroup=f"layout-{path}-{size // MiB}", note=note)


LAYERS, TENSORS, PB, PBB = 80, 2, 4096, 256


def _pairs_case(path, variant):
    nt = LAYERS * TENSORS

    def make(h):
        p = h.pair(path, nt, 2 * PB, PBB)
        np = _np()
        if variant == "contiguous":
            ids = np.arange(PB, dtype=np.uint64)
            return (lambda: p.dd.pull_kv_blocks(p.index, p.cache, ids, ids)), None
        src = np.arange(0, 2 * PB, 2, dtype=np.uint64)  # every other block: nothing merges
        dst = np.arange(1, 2 * PB, 2, dtype=np.uint64)
        prep = p.dd.prepare_transfer(p.index, p.cache, src, dst)
        assert prep.pairs * prep.segments == nt * PB
        return prep.execute, None

    base = None if variant == "contiguous" else f"layout/{path}/pairs-{nt * PB}/contiguous"
    return Case(f"layout/{path}/pairs-{nt * PB}/{variant}", "layout", make, baseline=base, bytes=nt * PB * PBB,
                blocks=nt * PB, reps="large", path=path, pgroup=f"layout-pairs-{path}",
                note=f"{LAYERS} layers x {TENSORS} tensors x {PB} blocks of {PBB} B, "
                     f"{'one range per tensor' if variant == 'contiguous' else 'prepared, no two blocks adjacent'}")


def _numpy_pairs_case(variant):
    nt = LAYERS * TENSORS

    def make(h):
        np = _np()
        src = np.full((nt, 2 * PB, PBB), 1, np.uint8)
        dst = np.zeros_like(src)
        if variant == "contiguous":
            def fn():
                dst[:, :PB] = src[:, :PB]
        else:
            def fn():
                dst[:, 1::2] = src[:, 0::2]  # every other block, as the prepared case
        return fn, None

    return Case(f"layout/pairs-{nt * PB}/numpy-{variant}", "layout", make, bytes=nt * PB * PBB, blocks=nt * PB,
                reps="large", path="raw", pgroup="layout-pairs-shm",
                note=f"numpy copy in this process of the same bytes, "
                     f"{'one range per tensor' if variant == 'contiguous' else 'every other 256-byte block'}")


def _plan_case(layers, tensors, blocks):
    nt = layers * tensors

    def make(h):
        p = h.pair("shm", nt, 2 * blocks, PBB)
        np = _np()
        src = np.arange(0, 2 * blocks, 2, dtype=np.uint64)
        dst = np.arange(1, 2 * blocks, 2, dtype=np.uint64)
        return (lambda: p.dd.prepare_transfer(p.index, p.cache, src, dst)), None

    return Case(f"layout/plan/{layers}x{tensors}x{blocks}", "layout", make, bytes=0, blocks=nt * blocks,
                reps="large", path="shm", pgroup="layout-plan",
                note=f"prepare_transfer of {nt * blocks} block-tensor pairs (numpy block lists)")


def layout_cases():
    """The layout group. Raises nothing."""
    cases = []
    for path in ("shm", "cma", "tcp"):
        for size in (64 * MiB, 256 * MiB):
            cases += [_transfer_case(path, size, v) for v in ("plain", "transform", "prepared", "heads", "nhd-hnd")]
    for path in ("shm", "cma"):
        cases += [_pairs_case(path, v) for v in ("contiguous", "prepared")]
    floors = [_numpy_pairs_case(v) for v in ("contiguous", "strided")]
    cases += floors
    shm_prepared = next(c for c in cases if c.id == f"layout/shm/pairs-{LAYERS * TENSORS * PB}/prepared")
    shm_prepared.beside = tuple(f.id for f in floors)  # timed in its rounds
    cases += [_plan_case(80, 2, 4096), _plan_case(61, 1, 8192)]
    return cases


__all__ = ["layout_cases", "KiB"]
