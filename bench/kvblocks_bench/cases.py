# SPDX-License-Identifier: Apache-2.0
"""The case matrix: kvblocks cases, each with the id of the baseline measured beside it.

Groups (``--case`` takes a group name or a glob over case ids): validation, dispatch, shm, cma,
tcp, encryption, integrity, async, scaling, limits, model, import, and base (the baselines, added to any
selection that needs them).
"""
from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tempfile

from . import baselines as bl
from . import cases_async, cases_hixl, cases_integrity, cases_layerwise, cases_layout, cases_limits, cases_tls
from .common import (KiB, MiB, SCALE_BLOCK_BYTES, SCALE_BLOCKS, SCALE_BLOCKS_64B,
                     SCALE_FIXED_BYTES, SCALE_LAYERS, SIZES, TRANSFER_PATHS, VALIDATION_NS, Case, human_bytes,
                     transfer_key)
from .common import np as _np
from .markers import check_blocks, id_lists, mark_blocks
from .transfers import transfer_fns


def _base_for(path, size, pattern):
    if path in ("tcp", "ucx"):
        return "tcp/raw-pingpong-8B" if size == "small" else f"tcp/raw-send/{size}"
    return f"base/gather/{size}/{pattern}"


def _transfer_case(path, size, direction, pattern):
    L, nb, bb, B = SIZES[size]

    def make(h):
        p = h.pair(path, 2 * L, nb, bb)
        rng = _np().random.default_rng(hash((path, size, direction, pattern)) & 0xFFFF)
        lists = id_lists(rng, nb, B, pattern, 64)
        return transfer_fns(h, p, direction, lists, rng, pattern, B)

    return Case(f"{path}/{size}/{direction}/{pattern}", path, make, baseline=_base_for(path, size, pattern),
                bytes=2 * L * B * bb, blocks=2 * L * B, reps=size, path=path,
                pgroup=f"{path if path in ('tcp', 'ucx') else 'samehost'}-{size}")


# ----------------------------------------------------------------------------- validation
def _validation_make(n, kind):
    def make(h):
        rng = _np().random.default_rng(n)
        s = rng.integers(0, n, n).astype(_np().uint64)
        d = rng.integers(0, n, n).astype(_np().uint64)
        if kind != "ndarray":
            s, d = s.tolist(), d.tolist()
        if kind == "python":
            return (lambda: bl.py_validate(s, d, n)), None
        import kvblocks as kb

        v = kb.validate_blocks
        return (lambda: v(s, d, n)), None
    return make


def _validation_cases():
    out = []
    for n in VALIDATION_NS:
        g, reps, base = f"validation-{n}", "small" if n < 65536 else "large", f"validation/python/{n}"
        out.append(Case(base, "validation", _validation_make(n, "python"), blocks=n, fast=n < 4096, pgroup=g,
                        reps=reps, note="pure-Python loop, list input"))
        out.append(Case(f"validation/ndarray/{n}", "validation", _validation_make(n, "ndarray"), baseline=base,
                        blocks=n, fast=n < 65536, pgroup=g, reps=reps, note="kb.validate_blocks, numpy uint64"))
        out.append(Case(f"validation/list/{n}", "validation", _validation_make(n, "list"), baseline=base,
                        blocks=n, fast=n < 4096, pgroup=g, reps=reps, note="kb.validate_blocks, Python list"))
    return out


# ----------------------------------------------------------------------------- in-process dispatch
def _check_sel(la, ra, s, d, sel):
    np = _np()
    bad = 0
    for t in range(len(la))[sel]:
        bad += int((la[t][np.asarray(d, np.int64)] != ra[t][np.asarray(s, np.int64)]).any(axis=1).sum())
    return bad


def _dispatch_make(bb, nt, as_list, layers):
    def make(h):
        import kvblocks as kb

        np = _np()
        rc, lc = h.inprocess()[2][(bb, nt)]
        n = 16 // nt
        s = np.arange(0, 4 * n, 4, dtype=np.uint64)
        d = np.arange(1, 4 * n + 1, 4, dtype=np.uint64)[::-1].copy()
        if as_list:
            s, d = s.tolist(), d.tolist()
        idx = kb.CacheIndex(1, rc.cache_id)
        pull = h.inprocess()[1].pull_kv_blocks
        if layers:
            ext = kb.KvCacheExtParam((1, 1), (1, 1), 2)
            fn = lambda: pull(idx, lc, s, d, ext)  # noqa: E731
        else:
            fn = lambda: pull(idx, lc, s, d)  # noqa: E731

        def verify():
            ra = [rc.numpy(i).reshape(64, bb) for i in range(nt)]
            la = [lc.numpy(i).reshape(64, bb) for i in range(nt)]
            nonce = next(h.nonce)
            mark_blocks(ra, s, nonce)
            fn()
            return _check_sel(la, ra, s, d, slice(2, 4)) if layers else check_blocks(la, d, s, nonce)
        return fn, verify
    return make


def _dispatch_cases():
    return [
        Case("dispatch/memcpy-64KiB", "dispatch", bl.memcpy_case(64 * KiB).make, bytes=64 * KiB, fast=True,
             note="np.copyto of 64 KiB"),
        Case("dispatch/pull-16x4KiB", "dispatch", _dispatch_make(4 * KiB, 1, False, False),
             baseline="dispatch/memcpy-64KiB", bytes=64 * KiB, blocks=16, fast=True, path="inprocess",
             note="1 tensor, 16 random-ish blocks"),
        Case("dispatch/memcpy-256B", "dispatch", bl.memcpy_case(256).make, bytes=256, fast=True,
             note="np.copyto of 256 B"),
        Case("dispatch/pull-16x16B", "dispatch", _dispatch_make(16, 1, False, False), baseline="dispatch/memcpy-256B",
             bytes=256, blocks=16, fast=True, path="inprocess",
             note="validation + call, no real data (16-byte blocks), ndarray ids"),
        Case("dispatch/pull-16x16B-list", "dispatch", _dispatch_make(16, 1, True, False),
             baseline="dispatch/memcpy-256B", bytes=256, blocks=16, fast=True, path="inprocess",
             note="as above, Python-list ids"),
        Case("dispatch/pull-4x16B-layer1of2", "dispatch", _dispatch_make(16, 4, False, True),
             baseline="dispatch/memcpy-256B", bytes=128, blocks=8, fast=True, path="inprocess",
             note="4 tensors, layer range (1,1): layer math + 8 copies"),
    ]


# ----------------------------------------------------------------------------- scaling
def _pull_make(path, nt, nb, bb, count, seed, how_many):
    def make(h):
        p = h.pair(path, nt, nb, bb)
        rng = _np().random.default_rng(seed)
        return transfer_fns(h, p, "pull", id_lists(rng, nb, count, "random", how_many), rng, "random", count)
    return make


def _scaling_cases():
    out = []
    for path in (p for p in TRANSFER_PATHS if p != "ucx"):  # UCX: small/mid/large beside NIXL
        for bb in SCALE_BLOCK_BYTES:
            nbytes = 64 * bb
            out.append(Case(f"scaling/bytes/{path}/{human_bytes(nbytes)}", "scaling",
                            _pull_make(path, 1, 256, bb, 64, bb, 16), baseline=f"base/memcpy/{human_bytes(nbytes)}",
                            bytes=nbytes, blocks=64, reps="large" if nbytes >= 16 * MiB else "small", path=path,
                            pgroup=f"scaling-bytes-{path}", series=f"kvblocks {path} pull",
                            note="1 tensor, 64 random blocks per call"))
    for n in SCALE_BLOCKS:
        bb = SCALE_FIXED_BYTES // n
        out.append(Case(f"scaling/blocks/shm/{n}x{human_bytes(bb)}", "scaling", _pull_make("shm", 1, n, bb, n, n, 3),
                        baseline=f"base/gather/{n}x{human_bytes(bb)}", bytes=SCALE_FIXED_BYTES, blocks=n,
                        reps="large", path="shm", pgroup="scaling-blocks-16MiB",
                        note="fixed 16 MiB per call, 1 tensor, random permutation"))
    for n in SCALE_BLOCKS_64B:
        out.append(Case(f"scaling/blocks/shm/{n}x64B", "scaling", _pull_make("shm", 1, n, 64, n, n + 1, 3),
                        baseline=f"base/gather/{n}x64B", bytes=64 * n, blocks=n,
                        reps="large" if n > 1024 else "small", path="shm",
                        pgroup="scaling-blocks-64B", note="64-byte blocks: per-block cost"))
    for L in SCALE_LAYERS:
        nbytes = 2 * L * 4 * 16 * KiB
        out.append(Case(f"scaling/layers/shm/{L}", "scaling", _pull_make("shm", 2 * L, 64, 16 * KiB, 4, L, 32),
                        baseline=f"base/memcpy/{human_bytes(nbytes)}", bytes=nbytes, blocks=2 * L * 4,
                        reps="small" if L <= 16 else "large", path="shm", pgroup="scaling-layers",
                        note=f"{L} layers x 2 tensors, 4 random 16 KiB blocks"))
    return out


# ----------------------------------------------------------------------------- import time
def _import_env():
    """This process's environment with the folder holding the imported kvblocks first on the path."""
    import kvblocks

    e = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))
    e["PYTHONPATH"] = root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def _import_case(module, baseline=None):
    code = ("import sys, time; t = time.perf_counter(); import %s; t = time.perf_counter() - t; "
            "print(t, 'numpy' in sys.modules)" % module)

    def run_once():
        # Run outside any source checkout, so the kvblocks measured is the one this process imported.
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_import_env(),
                             check=True, cwd=tempfile.gettempdir()).stdout.split()
        return float(out[0]), out[1] == "True"

    def make(h):
        check = (lambda: int(run_once()[1])) if module == "kvblocks" else None  # "bad" = numpy was imported
        return (lambda: run_once()), check

    def custom(h, n=15):
        run_once()
        return [run_once()[0] for _ in range(n)]

    c = Case(f"import/{module}", "import", make, baseline=baseline, reps="large", pgroup="import",
             note="time inside a fresh interpreter" + ("; numpy must not be imported" if module == "kvblocks" else ""))
    c.custom = custom
    return c


# ----------------------------------------------------------------------------- the matrix
def _ucx_block():
    """UCX (Transport=ucx over UCX_TLS) at three sizes, with kvblocks' TCP path and a raw socket at the
    middle one too (the small and large ones exist in the tcp block)."""
    out = [bl.raw_send_case("mid")] + [_transfer_case("tcp", "mid", d, "random") for d in ("pull", "push")]
    for c in out:
        c.group = "ucx"  # selected with --case ucx
    for size in ("small", "mid", "large"):
        out += [_transfer_case("ucx", size, d, p) for d in ("pull", "push") for p in ("random", "contig")]
    return out


def _transfer_block(path):
    """One path's cases in run order: raw baselines first, then pull and push (pairs grouped)."""
    if path == "ucx":
        return _ucx_block()
    out = [bl.pingpong_case(), bl.raw_blocks_case()] if path == "tcp" else []
    for size in ("small", "large"):
        if path == "tcp":
            out.append(bl.raw_send_case(size))
        if path == "tcp" and size == "large":
            out += [bl.raw_c_stream_case(size, way) for way in ("push", "pull")]
        if path == "cma":
            out += [bl.raw_cma_case(size, direction, "random") for direction in ("pull", "push")]
            if size == "large":  # the kernel's CMA floor on every core, timed beside the cma case
                n = cases_limits.usable_cpus()
                out += [bl.raw_cma_case(size, d, "random", threads=n) for d in ("pull", "push")]
        out += [_beside(_transfer_case(path, size, d, p)) for d in ("pull", "push") for p in ("random", "contig")]
        if path == "tcp" and size == "small":  # the round trip with both CPUs busy
            ping = bl.loaded(bl.pingpong_case())
            out += [ping, _beside(bl.loaded(_transfer_case(path, size, "pull", "random"), baseline=ping.id))]
            # and with both ends placed alike on one core, then on two (the ping-pong's two modes),
            # idle and loaded: unpinned, the scheduler picks one of these for each side
            for place in (bl.one_cpu, bl.two_cpus):
                for load in (None, bl.loaded):
                    ping, pull = bl.pingpong_case(), _transfer_case(path, size, "pull", "random")
                    if load is not None:
                        ping, pull = load(ping), load(pull)
                    ping = place(ping)
                    out += [ping, _beside(place(pull, baseline=ping.id))]
        if path == "shm" and size == "large":  # the memory bandwidth left with both CPUs busy
            L, _, bb, B = SIZES[size]
            copy = bl.loaded(bl.memcpy_case(2 * L * B * bb, pgroup="samehost-large"))
            out += [copy, bl.loaded(_transfer_case(path, size, "pull", "random"), baseline=copy.id)]
    return out


def _beside(c):
    """``c`` with the cases its targets compare it with timed in the same rounds: a large random
    shm transfer beside the memory bandwidth, its cma twin beside it and beside the kernel's CMA
    floor on all cores, a tcp one beside C streams of the same bytes both ways, and the small
    random tcp pull (placed or loaded too) beside the same blocks over a raw socket (when selected)."""
    _, size, d, pattern = c.id.split("/")[:4]
    if (c.path, size, d, pattern) == ("tcp", "small", "pull", "random"):
        c.beside = (bl.RAW_BLOCKS_ID,)
    elif size == "large" and pattern == "random" and transfer_key(c.id):
        c.beside = {"shm": ("base/memcpy-all/256MiB",),
                    "cma": (f"shm/large/{d}/random", f"base/raw-cma-all/large/{d}/random"),
                    "tcp": tuple(bl.c_stream_id(size, w) for w in ("pull", "push"))}.get(c.path, ())
    return c


def _scaling_baselines(scaling, have):
    out = []
    for c in scaling:
        if c.baseline and c.baseline not in have:
            if c.baseline.startswith("base/gather/"):
                out.append(bl.gather_rows_case(c.blocks, c.bytes // c.blocks, c.pgroup))
            else:
                out.append(bl.memcpy_case(c.bytes))
            have.add(c.baseline)
    return out


def all_cases():
    """Every case, baselines included, in run order (pairs grouped to limit allocation churn).
    Raises nothing."""
    cases = _validation_cases() + _dispatch_cases()
    for size in ("small", "large"):
        cases += [bl.gather_case(size, pattern) for pattern in ("random", "contig")]
        L, _, bb, B = SIZES[size]
        cases.append(bl.memcpy_case(2 * L * B * bb, pgroup=f"samehost-{size}"))
    for path in TRANSFER_PATHS:
        cases += _transfer_block(path)
    cases += cases_tls.tls_cases(_transfer_case)
    cases += cases_integrity.integrity_cases(_transfer_case)
    cases += cases_async.async_cases()
    cases += cases_hixl.hixl_cases()
    L, _, bb, B = SIZES["large"]
    cases += cases_limits.limits_cases(2 * L * B * bb)
    cases += cases_layerwise.layerwise_cases()
    cases += cases_layout.layout_cases()
    scaling = _scaling_cases()
    cases += _scaling_baselines(scaling, {c.id for c in cases}) + scaling
    cases.append(_import_case("json"))
    cases.append(_import_case("kvblocks", baseline="import/json"))
    by_id = {c.id: c for c in cases}
    for c in cases:  # a base row used by a group joins that group's pytest group
        if c.baseline and by_id[c.baseline].pgroup == "base" and c.group != "base":
            by_id[c.baseline].pgroup = c.pgroup
    return cases


def _matches(c, pat):
    return c.group == pat or fnmatch.fnmatch(c.id, pat) or c.id.startswith(pat.rstrip("/") + "/")


def select(cases, patterns):
    """Cases matching any pattern (group name or glob on the id), plus their baselines.

    Raises:
        SystemExit: no case matches (the message lists the groups).
    """
    if not patterns:
        return list(cases)
    by_id = {c.id: c for c in cases}
    want = {c.id for c in cases if any(_matches(c, pat) for pat in patterns)}
    if not want:
        raise SystemExit(f"no case matches {patterns}; groups: {sorted({c.group for c in cases})}")
    for _ in range(2):  # baselines, and baselines of baselines
        want |= {by_id[i].baseline for i in want if by_id[i].baseline}
    return [c for c in cases if c.id in want]


def cases_for(patterns, extra=()):
    """Cases matching ``patterns``, their same-run baselines and the ``extra`` ids, in run order.

    Raises:
        SystemExit: as :func:`select`.
    """
    every = all_cases()
    chosen = {c.id for c in select(every, list(patterns))} | set(extra)
    return [c for c in every if c.id in chosen]
