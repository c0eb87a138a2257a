# SPDX-License-Identifier: Apache-2.0
"""Several runs of ``kvblocks bench --json`` side by side: each run's date and load, and every target's
value in each run with the median over runs (what bench/RESULTS.md shows).

    python -m kvblocks_bench.summary run1.json run2.json run3.json > summary.md
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys


def _number(value):
    """The leading number of a target's value ("1.23x bw", "+0.50 us", "93 %"), or None."""
    m = re.match(r"[+-]?\d+(\.\d+)?", value)
    return float(m.group()) if m else None


def _load(meta, key):
    return "/".join(f"{x:.2f}" for x in meta.get(key, []))


def runs_table(runs):
    """Markdown: one row per run (date, load average at start and end). Raises KeyError on a run
    without ``meta``."""
    out = ["| run | finished (UTC) | load at start (1/5/15 min) | load at end |", "|---|---|---|---|"]
    for i, d in enumerate(runs, 1):
        m = d["meta"]
        out.append(f"| {i} | {m['date']} | {_load(m, 'load_avg_start')} | {_load(m, 'load_avg')} |")
    return "\n".join(out)


def targets_table(runs):
    """Markdown: every target with its goal, its value in each run, the median and how often it held.
    Raises KeyError on a run without ``targets``."""
    names = list(dict.fromkeys(t["target"] for d in runs for t in d["targets"]))
    by = [{t["target"]: t for t in d["targets"]} for d in runs]
    head = "| target | goal | " + " | ".join(f"run {i}" for i in range(1, len(runs) + 1)) + " | median | held |"
    out = [head, "|" + "---|" * (len(runs) + 4)]
    for n in names:
        rows = [b.get(n) for b in by]
        goal = next(r["goal"] for r in rows if r)
        vals = [r["value"] if r else "-" for r in rows]
        nums = [_number(r["value"]) for r in rows if r and _number(r["value"]) is not None]
        med = f"{statistics.median(nums):.3g}" if nums else "-"
        held = sum(1 for r in rows if r and r["ok"])
        out.append(f"| {n} | {goal} | " + " | ".join(vals) + f" | {med} | {held} of {sum(1 for r in rows if r)} |")
    return "\n".join(out)


def main(argv=None):
    """Prints both tables for the JSON files named in ``argv`` (``--help`` for usage). Raises
    SystemExit (bad arguments, an unreadable or foreign file: argparse's message, exit 2)."""
    ap = argparse.ArgumentParser(prog="python -m kvblocks_bench.summary",
                                 description="Several runs of kvblocks bench --json side by side.")
    ap.add_argument("runs", nargs="+", metavar="RUN.json", help="files written by kvblocks bench --json")
    args = ap.parse_args(argv)
    runs = []
    for p in args.runs:
        try:
            with open(p) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as e:
            ap.error(f"{p}: {e}")
    try:
        tables = runs_table(runs) + "\n\n" + targets_table(runs)
    except KeyError as e:
        ap.error(f"not a kvblocks bench --json file (no {e})")
    print(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
