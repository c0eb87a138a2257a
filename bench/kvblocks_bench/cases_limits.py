# SPDX-License-Identifier: Apache-2.0
"""Cases against the machine's limits: a memcpy split over every core (the memory bandwidth), CMA
against a plain process_vm_readv loop at 2-32 MiB, and transfers shaped like public models' KV caches.

Groups: ``limits`` (memcpy-all, the 2-32 MiB same-host cases) and ``model``.
"""
from __future__ import annotations

import os

from . import baselines as bl
from .transfers import transfer_fns
from .common import KiB, MiB, TRANSFER_PATHS, Case, human_bytes
from .common import np as _np
from .markers import id_lists

MID_BYTES = (2 * MiB, 8 * MiB, 32 * MiB)  # per call, 2 tensors of 16 KiB blocks
MID_BB = 16 * KiB

# name: (layers, tensors per layer, KV heads, head dim, bytes per element), from the models' published
# configs; 16 tokens per block (vLLM's default), 512 tokens (32 blocks) per call, random blocks.
MODELS = {
    "llama3-8b": (32, 2, 8, 128, 2),        # GQA, 8 KV heads
    "llama3-70b": (80, 2, 8, 128, 2),       # GQA, 80 layers
    "qwen2.5-7b": (28, 2, 4, 128, 2),       # GQA, 4 KV heads
    "deepseek-v3": (61, 1, 1, 576, 2),      # MLA: one latent (512 + 64 rope) per token and layer
}
TOKENS_PER_BLOCK, BLOCKS_PER_CALL = 16, 32


def usable_cpus():
    """The number of CPUs this process may run on. Raises nothing."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def memcpy_all_case(nbytes, pgroup):
    """``np.copyto`` of ``nbytes`` split in equal parts over every usable core (threads kept between
    calls; numpy copies without the GIL). Raises nothing; ``fn`` re-raises a worker's exception."""
    def make(h):
        from concurrent.futures import ThreadPoolExecutor

        np = _np()
        n = usable_cpus()
        src = np.full(nbytes, 7, dtype=np.uint8)
        dst = np.zeros(nbytes, dtype=np.uint8)
        cuts = [nbytes * k // n for k in range(n + 1)]
        parts = [(dst[a:b], src[a:b]) for a, b in zip(cuts, cuts[1:])]
        pool = ThreadPoolExecutor(max(1, n - 1))
        copyto = np.copyto

        def fn():
            futs = [pool.submit(copyto, d, s) for d, s in parts[1:]]
            copyto(*parts[0])
            for f in futs:
                f.result()
        return fn, None

    return Case(f"base/memcpy-all/{human_bytes(nbytes)}", "limits", make, bytes=nbytes,
                reps="large" if nbytes >= 16 * MiB else "small", pgroup=pgroup,
                note=f"np.copyto split over all {usable_cpus()} cores: the memory bandwidth")


# The kernel's floor on all cores at 2-32 MiB: the loop split over one thread per CPU, each copying
# its share of calls of this many bytes in a row (a hand-off to a Python thread costs tens of us on
# this VM, a large part of a 2 MiB call).
FLOOR_STREAM_BYTES = 64 * MiB


def _reps(nbytes):
    """The repetition policy for calls of ``nbytes``: "large" takes at most 40 samples, too few
    for calls of a few MiB, where one slow wake-up moves the median. Raises nothing."""
    return "large" if nbytes >= 16 * MiB else "mid"


def raw_cma_shape_case(id, nt, nb, bb, B, direction, pgroup, threads=1, repeat=1):
    """A ctypes process_vm_readv/writev loop over the blocks of a (nt, nb, bb) pair, B per tensor,
    one iovec per block, 1024 per call, iovecs built before timing, from one thread or split over
    ``threads``, ``repeat`` calls per sample (see :func:`bl.raw_cma_fn`). Raises nothing; ``fn``
    raises OSError when a call moves fewer bytes."""
    def make(h):
        return bl.raw_cma_fn(h.pair("cma", nt, nb, bb), direction, "random", B, threads, repeat), None

    how = "" if threads == 1 else f", split over {threads} threads, one pinned to each CPU"
    how += f", {repeat} calls in a row per sample" if repeat > 1 else ""
    nbytes = nt * B * bb * repeat
    return Case(id, "limits", make, bytes=nbytes, blocks=nt * B * repeat, reps=_reps(nbytes), path="raw",
                pgroup=pgroup,
                note=f"ctypes process_vm_readv/writev, 1 iovec per block (the kernel's CMA cost){how}")


def _shape_case(id, group, path, nt, nb, bb, B, direction, baseline, pgroup, note, series=None, per_layer=2):
    def make(h):
        import kvblocks as kb

        p = h.pair(path, nt, nb, bb)
        rng = _np().random.default_rng(hash(id) & 0xFFFF)
        ext = None if per_layer == 2 else kb.KvCacheExtParam((-1, -1), (-1, -1), per_layer)  # MLA: 1 per layer
        return transfer_fns(h, p, direction, id_lists(rng, nb, B, "random", 16), rng, "random", B, ext)

    return Case(id, group, make, baseline=baseline, bytes=nt * B * bb, blocks=nt * B, reps=_reps(nt * B * bb),
                path=path, pgroup=pgroup, note=note, series=series)


def _mid_cases():
    out = []
    for nbytes in MID_BYTES:
        B = nbytes // (2 * MID_BB)
        tag, g = human_bytes(nbytes), f"limits-{human_bytes(nbytes)}"
        for d in ("pull", "push"):
            raw, floor = f"base/raw-cma/{tag}/{d}", f"base/raw-cma-all/{tag}/{d}"
            out.append(raw_cma_shape_case(raw, 2, 2 * B, MID_BB, B, d, g))
            out.append(raw_cma_shape_case(floor, 2, 2 * B, MID_BB, B, d, g, threads=usable_cpus(),
                                          repeat=max(1, FLOOR_STREAM_BYTES // nbytes)))
            for path in ("shm", "cma"):
                out.append(_shape_case(f"limits/{path}/{tag}/{d}", "limits", path, 2, 2 * B, MID_BB, B, d,
                                       raw if path == "cma" else None, g,
                                       f"2 tensors, {B} random 16 KiB blocks each", series=f"kvblocks {path} {d}"))
            out[-1].beside = (floor,)  # in the cma case's rounds
    return out


def model_shape(name):
    """``(tensors, block bytes, bytes per call)`` of a MODELS entry. Raises KeyError."""
    layers, per_layer, heads, dim, el = MODELS[name]
    bb = TOKENS_PER_BLOCK * heads * dim * el
    nt = layers * per_layer
    return nt, bb, nt * BLOCKS_PER_CALL * bb


def _model_cases():
    out = []
    for name in MODELS:
        nt, bb, nbytes = model_shape(name)
        g = f"model-{name}"
        base = memcpy_all_case(nbytes, g)
        base.id = f"base/memcpy-all/model/{name}"
        out.append(base)
        for path in TRANSFER_PATHS:
            for d in ("pull", "push"):
                out.append(_shape_case(f"model/{name}/{path}/{d}", "model", path, nt, 2 * BLOCKS_PER_CALL, bb,
                                       BLOCKS_PER_CALL, d, base.id, g,
                                       f"{nt} tensors x {BLOCKS_PER_CALL} random blocks of {human_bytes(bb)}"
                                       f" ({TOKENS_PER_BLOCK} tokens), {BLOCKS_PER_CALL * TOKENS_PER_BLOCK} tokens",
                                       per_layer=MODELS[name][1]))
    return out


def limits_cases(samehost_large_bytes):
    """The limits and model cases, baselines first. Raises nothing."""
    return [memcpy_all_case(samehost_large_bytes, "samehost-large")] + _mid_cases() + _model_cases()
