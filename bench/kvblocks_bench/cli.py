# SPDX-License-Identifier: Apache-2.0
"""kvblocks bench: the benchmark matrix, each case next to a baseline from the same run.

Groups (--case takes a group name or a glob over case ids, repeatable):

  validation  block-list checks at 16/1k/64k/1M blocks vs a pure-Python loop
  dispatch    in-process pull_kv_blocks of 16 blocks vs a memcpy of the same bytes
  shm, cma    same-host cross-process pull/push (allocated caches use shared memory,
              registered numpy arrays use process_vm_readv/writev), small and large,
              random and contiguous ids, vs numpy memcpy and numpy block gather
  tcp         the same over kvblocks.Transport=tcp vs a raw socket and a raw 8-byte ping-pong;
              16x4KiB also beside the same blocks over a raw socket, with both CPUs busy, and
              placed on one CPU and on two, idle and busy
  ucx         kvblocks.Transport=ucx (needs the ucx extra) at 64 KiB / 4 MiB / 256 MiB per call, with
              --vs nixl: NIXL over the same UCX_TLS (KVBLOCKS_BENCH_UCX_TLS, default tcp), interleaved
  encryption  kvblocks.Encryption=tls (needs OpenSSL 3): 256 MiB TCP pull and push and the 16x4KiB pull,
              each vs the same transfer in clear
  integrity   the 256 MiB tcp pull and push with kvblocks.Integrity=crc32c, interleaved with the
              same transfer unchecked (the ratio is the CRC32C's cost)
  async       pull_kv_blocks_async submission vs validation; 64 TCP pulls in flight vs in a row
  hixl        Hixl.transfer_sync vs the native pull_kv_blocks of the same bytes (16x4KiB and
              32 MiB; in-process, same host (cma) and TCP)
  layerwise   80-layer layer-wise push over TCP behind a simulated compute, vs serial and compute alone
  layout      layout transforms (head slice, block ratio 2, NHD->HND) vs untransformed pulls of the same
              bytes on shm, cma, tcp at 64/256 MiB; prepared plans of 655,360 pairs; plan build times
  scaling     time vs bytes per call, vs blocks per call at fixed bytes, vs layers
  import      import kvblocks in a fresh interpreter

The peer is a real second process (multiprocessing spawn) holding its own LlmDataDist.
Each case is measured in alternating turns with its baseline; a push case also with its pull
counterpart (so their ratio is direct). --vs nixl / --vs mooncake measure the same-host
and TCP cases through those engines in the same alternating rounds as the kvblocks case
(optional; skipped with a message when they are not importable).

Examples:

  kvblocks bench                         # everything (~2 minutes on 2 cores)
  kvblocks bench --case shm --case tcp --json out.json --plot bw.png
  kvblocks bench --case 'shm/small/*' --vs nixl
  kvblocks bench --against 282f3e1 --case tcp   # this build vs a commit, alternating rounds
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from .cases import all_cases, select
from .engines import ENGINE_PATHS, engine_available, variants
from .harness import Harness
from .report import header, machine, markdown, plot, table, targets_table
from .runner import engine_applies, run_cases
from .targets import targets

DEPS = ("numpy", "tabulate", "tqdm")  # the bench extra; matplotlib stays optional (--plot)


def _parser():
    ap = argparse.ArgumentParser(prog="kvblocks bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--case", action="append", default=[], metavar="GROUP|GLOB",
                    help="run only these groups or case-id globs (repeatable); baselines are added")
    ap.add_argument("--list", action="store_true", help="list case ids and exit")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON")
    ap.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    ap.add_argument("--plot", metavar="FILE.png", help="bandwidth vs bytes per call (needs matplotlib)")
    ap.add_argument("--vs", action="append", default=[], choices=["nixl", "mooncake"],
                    help="also run the same-host / TCP cases through this engine, interleaved (repeatable)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--no-pairing", action="store_true",
                    help="measure baselines only once instead of interleaved with each case")
    ap.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    ap.add_argument("--against", metavar="REF",
                    help="compare this build with REF (a wheel, a built folder or a git commit) in alternating "
                         "rounds of small and large shm/cma/tcp pulls and pushes; --case then picks the paths")
    ap.add_argument("--rounds", type=int, default=8, metavar="N", help="rounds of --against (default 8)")
    return ap


def _plot_usable(path):
    if path and importlib.util.find_spec("matplotlib") is None:
        print("--plot needs matplotlib, which is not installed: pip install matplotlib "
              "(continuing without the plot)", file=sys.stderr)
        return None
    return path


def _engines(names, chosen):
    """(engine variants to run, skip messages) for ``--vs names`` and the chosen cases."""
    run, skipped = [], []
    for variant in (v for name in names for v in variants(name)):
        if not any(engine_applies(variant, c) for c in chosen):
            which = "/".join(ENGINE_PATHS[variant])
            skipped.append(f"{variant}: no {which} transfer case selected; nothing to compare")
            continue
        ok, why = engine_available(variant)
        if not ok:
            skipped.append(f"{variant}: not available ({why}); skipped")
            continue
        run.append(variant)
    return run, skipped


def _print_text(meta, rows, peer_rows, tg, skipped):
    print(header(meta))
    print("median/p10-p90 per call; 'vs base' = median time / median time of the baseline measured "
          "interleaved with it (< 1 is faster); "
          "'vs peer' = kvblocks time / peer engine time, measured interleaved\n")
    print(table(rows))
    if peer_rows:
        print("\npeer engines (each interleaved with the kvblocks case named in its id)\n")
        print(table(peer_rows))
    for s in skipped:
        print(s)
    if tg:
        print("\ntargets\n")
        print(targets_table(tg))


def _write_files(args, meta, rows, peer_rows, tg, skipped):
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "argv": sys.argv, "results": rows, "peers": peer_rows, "targets": tg,
                       "skipped": skipped}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, peer_rows, tg, skipped, meta))
    if args.plot and plot(rows, peer_rows, args.plot, meta):
        print(f"\nplot written to {args.plot}")


def _measure(args, chosen, engines):
    load_start = os.getloadavg()
    h = Harness()
    try:
        rows, peer_rows = run_cases(chosen, h, 0.3 if args.quick else 1.0, not args.no_progress,
                                    not args.no_pairing, engines)
    finally:
        h.close()
    return rows, peer_rows, machine(load_start)


def _against(args):
    from . import against
    paths = tuple(args.case) or against.PATHS
    unknown = [p for p in paths if p not in against.PATHS]
    if unknown or args.rounds < 1:
        raise SystemExit(f"--against: --case takes {', '.join(against.PATHS)} (got {unknown}); --rounds >= 1")
    return against.main(args.against, args.rounds, paths, args.quick, args.json, not args.no_progress)


def main(argv=None) -> int:
    """Runs the benchmark CLI with ``argv`` (default: sys.argv[1:]); returns the exit status:
    0, 1 when a case moved wrong data, 2 when the bench extra is not installed.

    Raises:
        SystemExit: bad arguments, ``--help``, or a ``--case`` that matches nothing.
        OSError: an output file cannot be written.
    """
    args = _parser().parse_args(argv)
    missing = [m for m in DEPS if importlib.util.find_spec(m) is None]
    if missing:
        print(f"the benchmarks need {', '.join(missing)}: pip install ./bench (in a kvblocks checkout)",
              file=sys.stderr)
        return 2
    if args.against:
        return _against(args)
    cases = all_cases()
    if args.list:
        for c in cases:
            print(f"{c.group:<11} {c.id}" + (f"   (baseline {c.baseline})" if c.baseline else ""))
        return 0
    chosen = select(cases, args.case)
    args.plot = _plot_usable(args.plot)
    engines, skipped = _engines(args.vs, chosen)
    rows, peer_rows, meta = _measure(args, chosen, engines)
    tg = targets(rows, peer_rows)
    _print_text(meta, rows, peer_rows, tg, skipped)
    _write_files(args, meta, rows, peer_rows, tg, skipped)
    bad = [r["id"] for r in rows + peer_rows if r.get("bad_blocks") and not r["id"].startswith("import/")]
    if bad:
        print(f"\nCORRUPT DATA in {bad}", file=sys.stderr)
        return 1
    return 0
