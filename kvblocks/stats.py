# SPDX-License-Identifier: Apache-2.0
"""``kvblocks stats``: print the transfer metrics of a process that runs kvblocks engines.

A CLI process has no engines of its own, so the numbers come from the serving process, which
exposes them with ``kvblocks.serve_metrics(PORT)`` (README "Metrics"):

    kvblocks stats http://127.0.0.1:9464/metrics     a table of that process's counters
    kvblocks stats URL --raw                         its exposition as served
    kvblocks stats                                   this process's own snapshot (JSON; empty here)
"""
import argparse
import json
import sys
import urllib.request

from kvblocks import prometheus as prom


def _table(samples) -> str:
    """Per (engine, peer, path, kind): transfers by status, bytes, mean latency."""
    rows = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        key = (d.get("engine", ""), d.get("peer", ""), d.get("path", ""), d.get("kind", ""))
        if name == "kvblocks_transfers_total":
            rows.setdefault(key, {}).setdefault("status", {})[d["status"]] = int(v)
        elif name in ("kvblocks_transfer_seconds_sum", "kvblocks_transfer_seconds_count"):
            rows.setdefault(key, {})[name.rsplit("_", 1)[1]] = v
    lines = [f"{'engine':>8} {'peer':>8} {'path':<10} {'kind':<18} {'count':>8} {'mean_ms':>9}  status"]
    for (eng, peer, path, kind), r in sorted(rows.items()):
        n = r.get("count", 0)
        mean = r.get("sum", 0) / n * 1e3 if n else 0.0
        st = " ".join(f"{k}={c}" for k, c in sorted(r.get("status", {}).items()))
        lines.append(f"{eng:>8} {peer:>8} {path:<10} {kind:<18} {int(n):>8} {mean:>9.3f}  {st}")
    for (name, labels), v in sorted(samples.items()):
        d = dict(labels)
        if name in ("kvblocks_link_events_total", "kvblocks_bytes_total") and v:
            what = d.get("event") or f"bytes {d.get('direction')} {d.get('path')}"
            lines.append(f"engine {d.get('engine')} peer {d.get('peer')}: {what} {int(v)}")
    return "\n".join(lines)


def main(argv=None, prog="kvblocks stats") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", nargs="?", help="a /metrics address served by kvblocks.serve_metrics (or any exposition)")
    ap.add_argument("--raw", action="store_true", help="print the exposition as fetched")
    ap.add_argument("--serve", type=int, metavar="PORT",
                    help="not here: a CLI process has no engines; see the message it prints")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for URL (default 5)")
    args = ap.parse_args(argv)
    if args.serve is not None:
        print(f"{prog}: this process has no kvblocks engines to serve. In the process that runs them call\n"
              f"  kvblocks.serve_metrics({args.serve})   # http://127.0.0.1:{args.serve}/metrics\n"
              f"(or register kvblocks.prometheus.KvblocksCollector() with your prometheus_client registry),\n"
              f"then read it with: {prog} http://127.0.0.1:{args.serve}/metrics", file=sys.stderr)
        return 2
    if args.url is None:
        import kvblocks

        print(json.dumps(kvblocks.metrics(), indent=1))
        return 0
    url = args.url if "://" in args.url else f"http://{args.url}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:
            text = r.read().decode()
    except OSError as e:
        print(f"{prog}: cannot read {url}: {e}", file=sys.stderr)
        return 1
    print(text if args.raw else _table(prom.parse(text)), end="\n" if not args.raw else "")
    return 0
