# SPDX-License-Identifier: Apache-2.0
"""Sizes, the repetition policy and small helpers shared by the benchmark modules."""
from __future__ import annotations

import importlib.util
import os

KiB = 1024
MiB = 1024 * 1024

# (layers, num_blocks, block_bytes, blocks per call); tensors = 2 * layers
SIZES = {
    "small": (2, 64, 4 * KiB, 4),
    "large": (32, 256, 64 * KiB, 64),
    "mid": (8, 128, 16 * KiB, 16),  # 4 MiB per call: the UCX cases' middle point (ucx/mid/*, tcp/mid/*)
}
# per-size repetition policy: (warmup calls, min reps, max reps, time budget s)
REPS = {
    "small": (50, 200, 3000, 0.4),
    "large": (2, 12, 40, 0.6),
    "mid": (5, 20, 400, 0.5),
}
VALIDATION_NS = (16, 1024, 65536, 1048576)
SCALE_BLOCK_BYTES = (1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)
SCALE_FIXED_BYTES = 16 * MiB
SCALE_BLOCKS = (16, 1024, 65536, 1048576)
SCALE_BLOCKS_64B = (1024, 65536, 1048576)
SCALE_LAYERS = (1, 2, 4, 8, 16, 32, 64)
DISPATCH_SHAPES = ((4 * KiB, 1), (16, 1), (16, 4))  # (block bytes, tensors) of the in-process caches
# "tls": tcp encrypted (kvblocks.Encryption=tls); "+crc32c": the local side also sets kvblocks.Integrity=crc32c
TRANSPORT = {"shm": "auto", "cma": "auto", "tcp": "tcp", "ucx": "ucx", "tls": "tls", "tcp-crc32c": "tcp+crc32c"}
KIND = {"shm": "alloc", "cma": "reg", "tcp": "alloc", "ucx": "alloc", "tls": "alloc", "tcp-crc32c": "alloc"}
# UCX_TLS of the kvblocks UCX cases; NIXL runs beside them over the same set (engines.engine_env).
UCX_TLS = os.environ.get("KVBLOCKS_BENCH_UCX_TLS", "tcp")


def ucx_available():
    """True when the ucx extra (the kvblocks-ucx plugin) is installed, as the runtime finds it
    (KVBLOCKS_UCX_PLUGIN: a path or "off"). Loads nothing of UCX. Raises nothing."""
    env = os.environ.get("KVBLOCKS_UCX_PLUGIN")
    if env:
        return env != "off" and os.path.exists(env)
    spec = importlib.util.find_spec("kvblocks_ucx")
    return spec is not None and spec.origin is not None and os.path.exists(
        os.path.join(os.path.dirname(spec.origin), "libkvblocks_ucx.so"))


TRANSFER_PATHS = ("shm", "cma", "tcp") + (("ucx",) if ucx_available() else ())


def np():
    """numpy, imported on first use so that a missing numpy gets the CLI's install hint.

    Raises:
        ImportError: numpy is not installed.
    """
    import numpy

    return numpy


def human_bytes(n):
    """``n`` bytes as the largest exact binary unit: ``64KiB``, ``16MiB``, ``256B``. Raises nothing."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return f"{n}B"


def transfer_key(case_id):
    """``(path, size, direction, pattern)`` for a kvblocks transfer case id such as
    ``shm/small/pull/random``, else None. Raises nothing."""
    parts = case_id.split("/")
    # Only path/size/direction/pattern: baselines such as tcp/raw-pingpong-8B/loaded/one-cpu also
    # have four parts, and no peer engine has them.
    if len(parts) == 4 and parts[0] in TRANSFER_PATHS and parts[2] in ("pull", "push"):
        return tuple(parts)
    return None


class Case:
    """One row. ``make(h)`` returns ``(fn, verify)``: ``fn()`` runs one call, ``verify()`` (or None)
    returns the number of bad blocks after one extra checked call."""

    def __init__(self, id, group, make, *, baseline=None, bytes=0, blocks=0, reps="small",
                 path="", fast=False, note="", pgroup=None, series=None):
        """Describes the case; runs nothing. Raises nothing."""
        self.id, self.group, self.make, self.baseline = id, group, make, baseline
        self.bytes, self.blocks, self.reps, self.path = bytes, blocks, reps, path
        self.fast = fast  # sub-10us: time batches of calls
        self.note = note
        self.pgroup = pgroup or group  # pytest-benchmark group
        self.series = series
        self.custom = None  # a function(h) -> samples in seconds (import times)
        self.after = None  # a function(h) run once the row is measured (stops a CPU load)
        self.beside = ()  # ids of selected cases timed in the same rounds as this one (row["beside"])

    def __repr__(self):
        return self.id
