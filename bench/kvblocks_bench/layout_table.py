# SPDX-License-Identifier: Apache-2.0
"""The layout speed table from several ``kvblocks bench --case layout --json`` runs (bench/RESULTS.md).

    python -m kvblocks_bench.layout_table run1.json run2.json run3.json

Per path x case x size: the bandwidth ratio to the untransformed pull of the same bytes measured in
the same rounds (plain median / case median: >= 0.7 is the target), its median and [min-max] over
the runs, the median GB/s, and each run's load average. Then the per-pair overhead of a prepared
plan of 655,360 pairs, and plan build times.
"""
from __future__ import annotations

import json
import statistics
import sys

PAIRS = 655360


def _rows(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        runs.append(({r["id"]: r for r in d["results"] if "median_s" in r}, d["meta"]))
    return runs


def _span(xs, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def transfer_table(runs):
    """Markdown rows of the transform and prepared cases. Raises KeyError for a run without them."""
    out = ["| path | size | case | ratio to plain (median [min-max]) | GB/s | plain GB/s |", "|---|---|---|---|---|---|"]
    for path in ("shm", "cma", "tcp"):
        for size in (64, 256):
            for v in ("transform", "prepared", "heads", "nhd-hnd"):
                cid = f"layout/{path}/{size}MiB/{v}"
                got = [r[cid] for r, _ in runs if cid in r]
                if not got:
                    continue
                ratios = [g["paired_baseline_median_s"] / g["median_s"] for g in got]
                gbs = [g["GBps"] for g in got]
                plain = [g["bytes"] / g["paired_baseline_median_s"] / 1e9 for g in got]
                out.append(f"| {path} | {size} MiB | {v} | {_span(ratios)} | {statistics.median(gbs):.2f} | "
                           f"{statistics.median(plain):.2f} |")
    return out


def pairs_table(runs):
    """Markdown rows of the per-pair overhead. Raises nothing."""
    out = ["| path | prepared - contiguous, ns per pair (median [min-max]) | numpy strided - contiguous, ns per pair |",
           "|---|---|---|"]
    for path in ("shm", "cma"):
        over, floor = [], []
        for r, _ in runs:
            g = r.get(f"layout/{path}/pairs-{PAIRS}/prepared")
            if not g:
                continue
            over.append((g["median_s"] - g["paired_baseline_median_s"]) * 1e9 / PAIRS)
            b = g.get("beside", {})
            c, s = b.get(f"layout/pairs-{PAIRS}/numpy-contiguous"), b.get(f"layout/pairs-{PAIRS}/numpy-strided")
            if c and s:
                floor.append((s["median_s"] - c["median_s"]) * 1e9 / PAIRS)
        if over:
            out.append(f"| {path} | {_span(over, '{:.0f}')} | {_span(floor, '{:.0f}') if floor else '-'} |")
    return out


def plan_table(runs):
    """Markdown rows of plan build times beside the time to move 1 GiB on shm. Raises nothing."""
    out = ["| plan | build (median [min-max]) | moving 1 GiB on shm at the plain 256 MiB rate |", "|---|---|---|"]
    one_gib = [4 * r["layout/shm/256MiB/plain"]["median_s"] for r, _ in runs if "layout/shm/256MiB/plain" in r]
    for shape in ("80x2x4096", "61x1x8192"):
        xs = [r[f"layout/plan/{shape}"]["median_s"] * 1e6 for r, _ in runs if f"layout/plan/{shape}" in r]
        if xs:
            out.append(f"| {shape} | {_span(xs, '{:.0f}')} us | {statistics.median(one_gib) * 1e3:.0f} ms |")
    return out


def main(argv=None):
    """Prints the tables. Raises OSError, KeyError, ValueError for unreadable runs."""
    runs = _rows(argv if argv is not None else sys.argv[1:])
    for _, m in runs:
        print(f"run {m['date']}: load average {m['load_avg_start'][0]:.1f} at start, {m['load_avg'][0]:.1f} at end "
              f"({m['cores']} cores)")
    print()
    print("\n".join(transfer_table(runs)))
    print()
    print("\n".join(pairs_table(runs)))
    print()
    print("\n".join(plan_table(runs)))


if __name__ == "__main__":
    main()
