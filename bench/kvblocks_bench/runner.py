# SPDX-License-Identifier: Apache-2.0
"""Runs the selected cases: each case in alternating turns with its baseline, with its pull
counterpart (push cases) and with the peer engines compared with it."""
from __future__ import annotations

import statistics
import sys

from .common import TRANSPORT, transfer_key
from .engines import ENGINE_PATHS
from .timing import LocalSide, measure_interleaved, median_ratio, summarize

SECTIONS = (("validation", "Validation: block-list checks vs a pure-Python loop"),
            ("dispatch", "In-process dispatch: pull_kv_blocks vs memcpy of the same bytes"),
            ("samehost", "Same host, cross-process (shm: allocated caches; cma: registered numpy arrays)"),
            ("tcp", "TCP (kvblocks.Transport=tcp) vs a raw loopback socket"),
            ("ucx", "UCX (kvblocks.Transport=ucx, UCX_TLS as NIXL's) vs a raw loopback socket"),
            ("async", "Asynchronous transfers: submission vs validation, 64 in flight vs sequential"),
            ("hixl", "hixl: Hixl.transfer_sync vs the native pull_kv_blocks of the same bytes"),
            ("layerwise", "Layer-wise pipeline: 80 layers pushed behind a simulated compute (sleep)"),
            ("scaling", "Scaling (shm unless named; pull, random ids)"),
            ("limits", "At the limits: shm and cma at 2-32 MiB (2 tensors of random 16 KiB blocks) vs a "
                       "process_vm_readv loop"),
            ("model", "Model-shaped transfers: 32 random blocks of 16 tokens per tensor, every layer, vs memcpy "
                      "on all cores"),
            ("import", "import kvblocks in a fresh interpreter"))


class Progress:
    """A tqdm bar on a terminal, one line per case otherwise (logs), nothing when disabled."""

    def __init__(self, total, enabled=True):
        """Raises: ImportError when enabled on a terminal and tqdm is not installed."""
        self.bar, self.enabled, self.total, self.i = None, enabled, total, 0
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=sys.stderr, leave=False, unit="case", dynamic_ncols=True)

    def step(self, label):
        """Announces the case about to run. Raises nothing."""
        self.i += 1
        if self.bar is not None:
            if self.i > 1:
                self.bar.update(1)
            self.bar.set_description_str(label[:48])
        elif self.enabled:
            sys.stderr.write(f"[{self.i:3d}/{self.total}] {label}\n")
            sys.stderr.flush()

    def done(self):
        """Clears the bar. Raises nothing."""
        if self.bar is not None:
            self.bar.close()


def engine_applies(engine, case):
    """Whether peer ``engine`` is measured beside ``case`` (a kvblocks transfer case on one of the
    paths the engine is compared with). Raises nothing."""
    key = transfer_key(case.id)
    return key is not None and key[0] in ENGINE_PATHS[engine]


class _Engines:
    """Engine processes, each started before the first case it is measured beside and stopped
    after its last, so that no idle engine shares the machine with unrelated cases."""

    def __init__(self, engines, cases):
        self.last = {e: max(i for i, c in enumerate(cases) if engine_applies(e, c))
                     for e in engines if any(engine_applies(e, c) for c in cases)}
        self.live = {}

    def beside(self, case):
        from .engine_side import EngineSide

        out = []
        for e in self.last:
            if engine_applies(e, case):
                if e not in self.live:
                    self.live[e] = EngineSide(e)
                out.append(self.live[e])
        return out

    def finished(self, i):
        for e, last in self.last.items():
            if last == i and e in self.live:
                self.live.pop(e).close()

    def close(self):
        for side in self.live.values():
            side.close()
        self.live.clear()


def _new_row(c):
    return {"id": c.id, "group": c.group, "section": section(c), "path": c.path, "bytes": c.bytes,
            "blocks": c.blocks, "baseline": c.baseline, "note": c.note,
            "engine": "kvblocks" if c.group != "base" else "numpy", **({"series": c.series} if c.series else {})}


def _pull_of(c, by_id):
    """The pull case measured beside push case ``c``, when both are selected."""
    key = transfer_key(c.id)
    if key and key[2] == "push":
        return by_id.get(f"{key[0]}/{key[1]}/pull/{key[3]}")
    return None


class _Run:
    def __init__(self, cases, h, scale, paired, engines):
        self.h, self.scale, self.paired, self.engines = h, scale, paired, engines
        self.by_id = {c.id: c for c in cases}
        self.made = {}  # baseline id -> fn, made once
        self.peer_rows = []

    def sides(self, c, fn):
        """[(name, side)]: the case first, then its baseline, its pull counterpart and the cases it
        is compared with (``c.beside``)."""
        b = self.by_id.get(c.baseline or "")
        if not (self.paired and b is not None and b.custom is None):
            b = None
        fast = c.fast or (b.fast if b else False)
        out = [("case", LocalSide(fn, fast))]
        if b is not None:
            if b.id not in self.made:
                self.made[b.id] = b.make(self.h)[0]
            out.append(("baseline", LocalSide(self.made[b.id], fast)))
        pull = _pull_of(c, self.by_id)
        if pull is not None:
            out.append(("pull", LocalSide(pull.make(self.h)[0], c.fast)))
        for other in filter(None, map(self.by_id.get, c.beside)):
            fn = self.made[other.id] if other.id in self.made else other.make(self.h)[0]
            out.append((f"beside:{other.id}", LocalSide(fn, c.fast)))
        return out

    def case(self, c):
        row = _new_row(c)
        try:
            fn, verify = c.make(self.h)
            if c.custom is not None:
                row.update(summarize(c.custom(self.h)))
            else:
                self.measure(c, fn, row)
            if c.group == "base":
                self.made[c.id] = fn
            if verify is not None:
                row["bad_blocks"] = verify()
            if c.path in TRANSPORT:
                row["link_path"] = self.h.link_path(TRANSPORT[c.path])
        except Exception as e:  # keep going; the row says why
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            if c.after is not None:
                c.after(self.h)
        return row

    def measure(self, c, fn, row):
        sides = self.sides(c, fn)
        engines = self.start_engines(c)
        got = measure_interleaved([s for _, s in sides] + [e for e, _ in engines], c.reps, self.scale)
        by_name = dict(zip([n for n, _ in sides], got))
        row.update(summarize(by_name["case"]))
        if "baseline" in by_name:
            row["paired_baseline_median_s"] = statistics.median(by_name["baseline"])
        if "pull" in by_name:  # pull and push from the same rounds: their ratio needs no baseline
            row["paired_pull_median_s"] = statistics.median(by_name["pull"])
            row["pull_vs_push"] = median_ratio(by_name["pull"], by_name["case"])
        for name, samples in by_name.items():  # the same rounds: a ratio no slow window skews
            if name.startswith("beside:"):
                row.setdefault("beside", {})[name[len("beside:"):]] = {
                    "median_s": statistics.median(samples), "ratio": median_ratio(by_name["case"], samples)}
        for (side, prow), samples in zip(engines, got[len(sides):]):
            self.finish_engine(side, prow, samples, row)

    def start_engines(self, c):
        """[(EngineSide, peer row)] for the engines that could set up this case."""
        out = []
        for side in self.engines.beside(c):
            _, size, direction, pattern = transfer_key(c.id)
            prow = {"id": f"{side.engine}/{c.id}", "engine": side.engine, "size": size, "dir": direction,
                    "pattern": pattern, "vs_case": c.id}
            self.peer_rows.append(prow)
            try:
                prow.update(side.start(size, direction, pattern))
                out.append((side, prow))
            except RuntimeError as e:
                prow["error"] = str(e)
        return out

    def finish_engine(self, side, prow, samples, row):
        try:
            if side.error or not samples:
                raise RuntimeError(side.error or "no samples")
            prow.update(summarize(samples))
            prow["bad_blocks"] = side.verify()
            # the engine's and the case's samples come from the same rounds: a direct ratio
            row.setdefault("vs", {})[side.engine] = row["median_s"] / prow["median_s"]
        except RuntimeError as e:
            prow["error"] = str(e)


def run_cases(cases, h, scale=1.0, progress=True, paired=True, engines=()):
    """Measures ``cases`` in order; returns ``(rows, peer_rows)``. A failing case (or engine) gets
    an ``error`` in its row instead of stopping the run.

    Raises:
        ImportError: progress on a terminal without tqdm installed.
    """
    bar = Progress(len(cases), progress)
    pool = _Engines(engines, cases)
    run = _Run(cases, h, scale, paired, pool)
    rows = []
    try:
        for i, c in enumerate(cases):
            bar.step(c.id)
            rows.append(run.case(c))
            pool.finished(i)
    finally:
        pool.close()
        bar.done()
    derive(rows)
    for r in run.peer_rows:
        if r.get("median_s") and r.get("bytes"):
            r["GBps"] = r["bytes"] / r["median_s"] / 1e9
    order = {e: k for k, e in enumerate(engines)}  # peer rows grouped by engine, as the flags list them
    return rows, sorted(run.peer_rows, key=lambda r: order[r["engine"]])


def section(c):
    """The report section of case ``c`` (a key of SECTIONS, or "other"). Raises nothing."""
    for key, _ in SECTIONS:
        if c.pgroup.startswith(key):
            return key
    return "other"


def derive(rows):
    """Adds GB/s, ns per block and the time ratio to the baseline to every measured row.
    Raises nothing."""
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        med = r.get("median_s")
        if not med:
            continue
        if r["bytes"] and r["bytes"] > 8:
            r["GBps"] = r["bytes"] / med / 1e9
        if r["blocks"]:
            r["ns_per_block"] = med / r["blocks"] * 1e9
        b = by_id.get(r.get("baseline") or "")
        if r.get("paired_baseline_median_s"):  # interleaved with the case: the robust ratio
            r["ratio"] = med / r["paired_baseline_median_s"]
        elif b and b.get("median_s"):
            r["ratio"] = med / b["median_s"]  # time ratio: < 1 is faster than the baseline
