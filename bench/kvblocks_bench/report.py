# SPDX-License-Identifier: Apache-2.0
"""Output: plain and Markdown tables (tabulate), the machine description, the plot (matplotlib).

Every format carries the CPU count and the load average before and after the run: on a shared
machine they say how far the absolute times can be trusted.
"""
from __future__ import annotations

import os
import platform
import sys
import time

from .common import human_bytes
from .runner import SECTIONS

HEAD = ["case", "bytes/call", "median", "p10-p90", "GB/s", "ns/block", "vs base", "vs peer", "check"]


def _fmt_t(s):
    if s is None:
        return "-"
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us" if s < 1e-5 else f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _tabulate(head, lines, markdown):
    from tabulate import tabulate

    if markdown:  # a "|" inside a cell would split it
        lines = [[x.replace("|", "/") for x in ln] for ln in lines]
    return tabulate(lines, head, tablefmt="github" if markdown else "simple", disable_numparse=True,
                    stralign="left")


def _check(r):
    if "bad_blocks" not in r:
        return ""
    if r["id"] == "import/kvblocks":
        return "no numpy" if r["bad_blocks"] == 0 else "numpy imported"
    return "ok" if r["bad_blocks"] == 0 else f"BAD {r['bad_blocks']}"


def _cells(r):
    if r.get("error"):
        return [r["id"], "", "ERROR", r["error"][:60], "", "", "", "", ""]
    vs = ", ".join(f"{k} {v:.2f}x" for k, v in sorted(r.get("vs", {}).items()))
    per_block = r.get("ns_per_block") and r.get("group") in ("validation", "scaling")
    return [
        r["id"],
        human_bytes(r["bytes"]) if r.get("bytes") else "-",
        _fmt_t(r.get("median_s")),
        f"{_fmt_t(r.get('p10_s'))} - {_fmt_t(r.get('p90_s'))}",
        f"{r['GBps']:.2f}" if r.get("GBps") else "-",
        f"{r['ns_per_block']:.1f}" if per_block else "-",
        f"{r['ratio']:.2f}x" if r.get("ratio") else ("base" if not r.get("baseline") else "-"),
        vs or "-",
        _check(r),
    ]


def table(rows, markdown=False):
    """The rows as a plain-text (or Markdown) table.

    Raises:
        ImportError: tabulate is not installed.
    """
    return _tabulate(HEAD, [_cells(r) for r in rows], markdown)


def targets_table(tg, markdown=False):
    """The targets as a plain-text (or Markdown) table.

    Raises:
        ImportError: tabulate is not installed.
    """
    lines = [[t["target"], t["value"], t["goal"], "-" if t["ok"] is None else "yes" if t["ok"] else "NO", t["detail"]] for t in tg]
    return _tabulate(["target", "measured", "goal", "holds", "detail"], lines, markdown)


def _load(la):
    return "/".join(f"{x:.2f}" for x in la)


def load_line(meta):
    """``2 cores, load average 1.02/0.88/0.60 (1/5/15 min) at start, ... at end``. Raises nothing."""
    return (f"{meta['cores']} cores, load average {_load(meta['load_avg_start'])} (1/5/15 min) at start, "
            f"{_load(meta['load_avg'])} at end")


def header(meta):
    """The first line of the plain-text report. Raises nothing."""
    return f"kvblocks {meta['kvblocks']} bench  {meta['date']}  {load_line(meta)}  {meta['cpu']}"


def markdown(rows, peer_rows, tg, skipped=(), meta=None):
    """The tables as Markdown, one per section (what bench/RESULTS.md holds), after a line with
    the machine's cores and load.

    Raises:
        ImportError: tabulate is not installed.
    """
    out = [f"_kvblocks {meta['kvblocks']}, {meta['date']}, {meta['cpu']}, {load_line(meta)}._", ""] if meta else []
    if tg:
        out += ["### Targets", "", targets_table(tg, True), ""]
    for key, title in SECTIONS:
        sec = [r for r in rows if r.get("section") == key]
        if sec:
            out += [f"### {title}", "", table(sec, True), ""]
    if peer_rows:
        out += ["### Peer engines, each interleaved with the kvblocks case named in its id", "",
                table(peer_rows, True), ""]
    out += [f"- {s}" for s in skipped]
    return "\n".join(out) + "\n"


def _cpu_name():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def _memory():
    try:
        with open("/proc/meminfo") as f:
            return f"{int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        return ""


def machine(load_start=None):
    """The machine, this interpreter, kvblocks' version, the CPU count and the load average now
    (``load_avg``) and at the start of the run (``load_avg_start``, default: now).

    Raises:
        OSError: the load average is unavailable (not on Linux or macOS).
    """
    import kvblocks

    now = os.getloadavg()
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu": _cpu_name(), "cores": os.cpu_count(),
            "memory": _memory(), "kernel": platform.release(), "python": platform.python_version(),
            "kvblocks": getattr(kvblocks, "__version__", "?"), "load_avg": now,
            "load_avg_start": tuple(load_start) if load_start else now}


def _series(rows, peer_rows):
    series = {}
    for r in rows:
        parts = r["id"].split("/")
        if not r.get("GBps"):
            continue
        if r["id"].startswith("scaling/bytes/"):
            name = f"kvblocks {r['path']} pull (64 random blocks)"
        elif r["id"].startswith("base/memcpy/"):
            name = "numpy memcpy"
        elif len(parts) == 4 and parts[0] in ("shm", "cma", "tcp") and r["id"].endswith("pull/random"):
            name = f"kvblocks {r['path']} pull (small/large cases)"
        elif r["id"].startswith("tcp/raw-send/"):
            name = "raw socket send"
        elif r.get("series", "").endswith(" pull"):
            name = f"{r['series']} (2 tensors, 16 KiB blocks)"
        elif parts[0] == "model" and parts[-1] == "pull":
            name = f"kvblocks {r['path']} pull (model shapes)"
        else:
            continue
        series.setdefault(name, []).append((r["bytes"], r["GBps"]))
    for r in peer_rows:
        if r.get("GBps") and r.get("dir") == "pull" and r.get("pattern") == "random":
            pts = series.setdefault(f"{r['engine']} pull", [])
            if all(b != r["bytes"] for b, _ in pts):  # nixl runs beside shm and cma: first one only
                pts.append((r["bytes"], r["GBps"]))
    return series


def plot(rows, peer_rows, path, meta=None):
    """Bandwidth vs bytes per call per path into ``path`` (PNG); True when written, False (with a
    hint on stderr) when matplotlib is missing.

    Raises:
        OSError: ``path`` cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib, which is not installed: pip install matplotlib", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(12, 5.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # more series than tab10's colours
    for name, pts in sorted(_series(rows, peer_rows).items()):
        pts.sort()
        cases_only = ("small/large" in name or "model shapes" in name
                      or "pull" in name and not name.startswith("kvblocks"))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="x" if cases_only else "o",
                linestyle=":" if cases_only else "-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per call")
    ax.set_ylabel("GB/s (median)")
    title = "kvblocks: bandwidth vs transfer size per path"
    ax.set_title(title + (f"\n{meta['date']}, {load_line(meta)}" if meta else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
