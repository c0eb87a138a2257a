# SPDX-License-Identifier: Apache-2.0
"""Measurement: sides measured in alternating turns, and their summary statistics.

A *side* is anything with ``calibrate(n) -> seconds per call`` and ``turn(batch, m) -> samples``:
a function in this process (:class:`LocalSide`) or a peer engine in its own process
(:class:`kvblocks_bench.engines.EngineSide`). A case, its baseline, its pull counterpart and the
peer engines compared with it are measured in the same rounds, one turn each, so that a load
change on a shared machine hits all of them alike and their ratios can be taken directly.
"""
from __future__ import annotations

import random
import statistics
import time

from .common import REPS

_perf = time.perf_counter


class LocalSide:
    """``fn`` called in this process; ``fast`` cases (sub-20 us) are timed in batches."""

    def __init__(self, fn, fast=False):
        """Raises nothing."""
        self.fn, self.fast = fn, fast

    def calibrate(self, n):
        """Calls ``fn`` ``n`` times (the warm-up) and returns the seconds per call.

        Raises:
            Exception: whatever ``fn`` raises.
        """
        fn = self.fn
        t0 = _perf()
        for _ in range(n):
            fn()
        return (_perf() - t0) / n

    def turn(self, batch, m):
        """``m`` samples, each the mean seconds per call over ``batch`` calls.

        Raises:
            Exception: whatever ``fn`` raises.
        """
        fn, out, r = self.fn, [], range(batch)
        for _ in range(m):
            t = _perf()
            if batch == 1:
                fn()
            else:
                for _ in r:
                    fn()
            out.append((_perf() - t) / batch)
        return out


def _plan(one, fast, alone):
    """(calls per sample, samples per turn) for a side taking ``one`` s per call."""
    batch = max(1, min(1000, int(100e-6 / max(one, 50e-9)))) if fast and one < 20e-6 else 1
    if alone:
        return batch, 1
    # consecutive samples per turn: ~2 ms per side, so latency cases keep their caches warm
    return batch, max(1, min(200, int(2e-3 / max(one * batch, 1e-7))))


def measure_interleaved(sides, reps="small", scale=1.0):
    """Samples (seconds per call) of every side, taken in alternating turns until the first side
    has its minimum count and the time budget (``REPS[reps]`` per side, times ``scale``) is spent,
    or it has its maximum count. Each round takes the sides in a new order (shuffled, with a fixed
    seed), so no side always follows the same one: a peer engine's threads may stay busy for a while
    after its turn. Returns one list of samples per side.

    Raises:
        KeyError: unknown ``reps``.
        Exception: whatever a side raises.
    """
    warm, lo, hi, budget = REPS[reps]
    n = max(1, int(warm * min(1.0, scale)))
    plans = [_plan(s.calibrate(n), s.fast, len(sides) == 1) for s in sides]
    out = [[] for _ in sides]
    lo = max(3, int(lo * min(1.0, scale)))
    end = _perf() + len(sides) * budget * scale
    turns = list(zip(sides, plans, out))
    order = random.Random(len(sides))
    while len(out[0]) < hi and (len(out[0]) < lo or _perf() < end):
        for side, (batch, m), samples in turns:
            samples.extend(side.turn(batch, m))
        order.shuffle(turns)
    return out


def measure(fn, reps="small", fast=False, scale=1.0):
    """Samples (seconds per call) of ``fn`` alone. Fast cases are timed in batches calibrated to ~100 us.

    Raises:
        KeyError: unknown ``reps``.
        Exception: whatever ``fn`` raises.
    """
    return measure_interleaved([LocalSide(fn, fast)], reps, scale)[0]


def summarize(samples):
    """Median, p10, p90 (linear interpolation), min and count of ``samples``.

    Raises:
        statistics.StatisticsError: ``samples`` is empty.
    """
    s = sorted(samples)
    if len(s) == 1:
        p10 = p90 = s[0]
    else:
        deciles = statistics.quantiles(s, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[-1]
    return {"median_s": statistics.median(s), "p10_s": p10, "p90_s": p90, "min_s": s[0], "n": len(s)}


def median_ratio(a, b):
    """median(a) / median(b): two sides' samples from the same rounds. Raises nothing; None when
    either is empty or b's median is 0."""
    if not a or not b:
        return None
    mb = statistics.median(b)
    return statistics.median(a) / mb if mb else None
