# SPDX-License-Identifier: Apache-2.0
"""The project's performance targets, checked against one run's rows."""
from __future__ import annotations

from .baselines import RAW_BLOCKS_ID, c_stream_id


def _base_med(r, by):
    return r.get("paired_baseline_median_s") or by[r["baseline"]]["median_s"]


def _samehost(by, pe, add):
    for path in ("shm", "cma"):
        r = by.get(f"{path}/small/pull/random")
        if r:
            n = pe.get(f"nixl/{path}/small/pull/random")
            if n:  # compared only against NIXL measured in this run, never against a constant
                v = r["median_s"] / n["median_s"]
                add(f"{path} small pull random vs NIXL", f"{v:.3f}x", "<= 0.25x", v <= 0.25,
                    f"{r['median_s'] * 1e6:.1f} us vs {n['median_s'] * 1e6:.1f} us (NIXL same run, interleaved)")
        for d in ("pull", "push"):
            r = by.get(f"{path}/large/{d}/random")
            if r and r.get("ratio"):
                v = 1 / r["ratio"]
                gb = r["bytes"] / _base_med(r, by) / 1e9
                add(f"{path} large {d} random vs numpy gather", f"{v:.2f}x bw", ">= 0.9x", v >= 0.9,
                    f"{r['GBps']:.2f} vs {gb:.2f} GB/s (interleaved)"
                    + _floor_vs(r, by, f"base/raw-cma-all/large/{d}/random", r["baseline"]))


SHM_LOADED_BEFORE = 0.69  # shm large pull / one-core memcpy, both CPUs busy: the best before the copy pool


def _bw_vs(r, other):
    """(row ``r``'s bandwidth / ``other``'s, ``other``'s GB/s, how they were timed): from the rounds
    they shared when ``other`` was timed beside ``r``, else from their own medians."""
    paired = r.get("beside", {}).get(other["id"])
    if paired and paired.get("ratio"):
        return 1 / paired["ratio"], other["bytes"] / paired["median_s"] / 1e9, "interleaved"
    return other["median_s"] / r["median_s"], other["GBps"], "same run"


def _paired_median(r, other_id):
    """The median of ``other_id`` from the rounds it shared with row ``r`` (beside it, or its
    interleaved baseline), else None."""
    if other_id in r.get("beside", {}):
        return r["beside"][other_id]["median_s"]
    return r.get("paired_baseline_median_s") if other_id == r.get("baseline") else None


def _floor_vs(r, by, floor_id, other_id):
    """"; the kernel's floor ...: X x", the bandwidth of ``floor_id`` over ``other_id``'s from the
    rounds both shared with row ``r``, else ""."""
    f, o = _paired_median(r, floor_id), _paired_median(r, other_id)
    if not (f and o and floor_id in by and other_id in by):
        return ""
    return f"; the kernel's floor, all cores: {by[floor_id]['bytes'] / f / (by[other_id]['bytes'] / o):.2f}x"


def _integrity(by, add):
    for d in ("pull", "push"):
        r = by.get(f"tcp-crc32c/large/{d}/random")
        if r and r.get("ratio"):
            v = r["ratio"]  # checked time / unchecked time, the same rounds
            gb = r["bytes"] / _base_med(r, by) / 1e9
            add(f"tcp large {d} with kvblocks.Integrity=crc32c vs without", f"{v:.3f}x", "<= 1.15x", v <= 1.15,
                f"{r['GBps']:.2f} vs {gb:.2f} GB/s (interleaved)")


def _encryption(by, add):
    """kvblocks.Encryption=tls against the same transfer in clear (issue 30's bounds), with the same
    bytes through the system's OpenSSL used directly (Python's ssl) where it was timed beside."""
    for d in ("pull", "push"):
        r = by.get(f"tls/large/{d}/contig")
        if not (r and r.get("ratio")):
            continue
        v = 1 / r["ratio"]  # clear time / TLS time, the same rounds: the bandwidth ratio
        detail = f"{r['GBps']:.2f} vs {r['bytes'] / _base_med(r, by) / 1e9:.2f} GB/s in clear (interleaved)"
        raw = by.get(f"tls/raw-openssl/large/{d}")
        if raw:
            bw, gb, how = _bw_vs(r, raw)
            detail += f"; OpenSSL used directly (Python ssl): {gb:.2f} GB/s, kvblocks {bw:.2f}x its bandwidth ({how})"
        add(f"tls large {d} vs clear", f"{v:.2f}x bw", ">= 0.5x" if d == "pull" else "-", v >= 0.5 if d == "pull" else None,
            detail)
    r = by.get("tls/small/pull/random")
    if r and r.get("ratio"):
        add("tls small pull random vs clear", f"{r['ratio']:.2f}x", "<= 1.5x", r["ratio"] <= 1.5,
            f"{r['median_s'] * 1e6:.1f} us vs {_base_med(r, by) * 1e6:.1f} us in clear (interleaved)")


def _limits(by, add):
    """Issue 13's same-host targets: shm at the memory bandwidth, cma near shm and ahead of raw CMA."""
    r = by.get("shm/large/pull/random/loaded")
    if r and r.get("ratio"):
        v = 1 / r["ratio"]
        add("shm large pull vs memcpy, both CPUs busy", f"{v:.2f}x bw", f">= {SHM_LOADED_BEFORE}x", v >= SHM_LOADED_BEFORE,
            f"{r['GBps']:.2f} GB/s (interleaved; before: 0.48-0.69x, 6.6-9.4 GB/s)")
    all_core = by.get("base/memcpy-all/256MiB")
    for d in ("pull", "push"):
        shm, cma = by.get(f"shm/large/{d}/random"), by.get(f"cma/large/{d}/random")
        if shm and all_core:
            v, gb, how = _bw_vs(shm, all_core)
            add(f"shm large {d} vs memcpy on all cores", f"{v:.2f}x bw", ">= 0.9x", v >= 0.9,
                f"{shm['GBps']:.2f} vs {gb:.2f} GB/s ({how})")
        floor_id = f"base/raw-cma-all/large/{d}/random"
        floor = by.get(floor_id)
        if shm and cma:
            v, gb, how = _bw_vs(cma, shm)
            add(f"cma large {d} vs shm", f"{v:.2f}x bw", ">= 0.8x", v >= 0.8,
                f"{cma['GBps']:.2f} vs {gb:.2f} GB/s ({how})" + _floor_vs(cma, by, floor_id, shm["id"]))
        if cma and floor:
            v, gb, how = _bw_vs(cma, floor)
            add(f"cma large {d} vs process_vm_{'readv' if d == 'pull' else 'writev'} on all cores", f"{v:.2f}x bw",
                ">= 0.9x", v >= 0.9, f"{cma['GBps']:.2f} vs {gb:.2f} GB/s ({how}): the kernel's CMA floor")
        for tag in ("2MiB", "8MiB", "32MiB"):
            r = by.get(f"limits/cma/{tag}/{d}")
            if r and r.get("ratio"):
                v = 1 / r["ratio"]
                floor_vs = _floor_vs(r, by, f"base/raw-cma-all/{tag}/{d}", r["baseline"])
                add(f"cma {tag} {d} vs process_vm_readv loop", f"{v:.2f}x", ">= 1.5x", v >= 1.5,
                    f"{r['GBps']:.2f} GB/s (interleaved){floor_vs}")


def _tcp(by, add):
    for d in ("pull", "push"):
        r, c = by.get(f"tcp/large/{d}/random"), by.get(c_stream_id("large", d))
        if r and r.get("ratio"):
            v = 1 / r["ratio"]
            gb = r["bytes"] / _base_med(r, by) / 1e9
            add(f"tcp large {d} random vs raw Python sendall", f"{v:.2f}x bw", ">= 1.0x", v >= 1.0,
                f"{r['GBps']:.2f} vs {gb:.2f} GB/s (interleaved)")
        if r and c:
            v, gb, how = _bw_vs(r, c)
            add(f"tcp large {d} random vs raw C stream the same way, 1 MiB writes", f"{v:.2f}x bw", ">= 1.0x",
                v >= 1.0, f"{r['GBps']:.2f} vs {gb:.2f} GB/s ({how})")
    r = by.get("tcp/large/push/random")
    if r and r.get("pull_vs_push"):
        v = r["pull_vs_push"]  # pull and push measured in the same rounds
        streams = [_paired_median(r, c_stream_id("large", d)) for d in ("pull", "push")]
        floor = f"; the raw C streams, same rounds: {streams[0] / streams[1]:.2f}x" if all(streams) else ""
        add("tcp large pull vs push time", f"{v:.2f}x", "within 10%", abs(v - 1) <= 0.10,
            f"{r['bytes'] / r['paired_pull_median_s'] / 1e9:.2f} vs {r['GBps']:.2f} GB/s; "
            "pull and push interleaved" + floor)
    for load, goal, busy in (("", 2, ""), ("/loaded", 3, "both CPUs busy")):
        for place, where in (("", ""), ("/one-cpu", "both ends on one CPU"), ("/two-cpu", "each end on its own CPU")):
            r = by.get(f"tcp/small/pull/random{load}{place}")
            if r and r.get("ratio"):
                say = ", ".join(filter(None, (busy, where)))
                v = r["ratio"]
                add("tcp small pull random vs ping-pong RTT" + (f" ({say})" if say else ""), f"{v:.2f}x",
                    f"<= {goal}x", v <= goal, f"{r['median_s'] * 1e6:.1f} us vs {_base_med(r, by) * 1e6:.1f} us "
                    "(interleaved)" + _raw_blocks(r, by) + ("" if place else _placed(by, load)))


def _raw_blocks(r, by):
    """"; the same blocks over a raw socket ...": the floor of a 16 x 4 KiB pull, an 8-byte request
    answered with its blocks, timed in the same rounds. Raises nothing; "" when it was not."""
    raw = r.get("beside", {}).get(RAW_BLOCKS_ID)
    if not raw:
        return ""
    return (f"; the same blocks over a raw socket, same rounds: {raw['median_s'] * 1e6:.1f} us "
            f"({raw['median_s'] / _base_med(r, by):.2f}x the ping-pong; the pull {raw['ratio']:.2f}x it)")


def _placed(by, load):
    """"; placed ...": unpinned, the scheduler may put both ends of the ping-pong on one CPU and the
    two ends of a pull on two, so the placed ping-pongs and pulls of the same run (``load``: "" or
    "/loaded") bound the round trip each way. Raises nothing; "" when they were not measured."""
    rows = {(who, p): by.get(f"{case}{load}/{p}") for who, case in (("ping-pong", "tcp/raw-pingpong-8B"),
                                                                    ("pull", "tcp/small/pull/random"))
            for p in ("one-cpu", "two-cpu")}
    if not all(rows.values()):
        return ""
    return "; placed on one CPU / on two (same run): " + ", ".join(
        f"{who} {rows[who, 'one-cpu']['median_s'] * 1e6:.1f} / {rows[who, 'two-cpu']['median_s'] * 1e6:.1f} us"
        for who in ("ping-pong", "pull"))


def _ucx(by, pe, add):
    """kvblocks over UCX vs NIXL over the same UCX_TLS (interleaved), and vs kvblocks' own TCP."""
    for size in ("small", "mid", "large"):
        for d in ("pull", "push"):
            for pat in ("random", "contig"):
                r = by.get(f"ucx/{size}/{d}/{pat}")
                if not r:
                    continue
                n = pe.get(f"nixl-tcp/ucx/{size}/{d}/{pat}")
                if n:
                    v = r["median_s"] / n["median_s"]
                    add(f"ucx {size} {d} {pat} vs NIXL (same UCX_TLS)", f"{v:.2f}x", "<= 1.0x", v <= 1.0,
                        f"{r['median_s'] * 1e6:.1f} us vs {n['median_s'] * 1e6:.1f} us (interleaved)")
                t = by.get(f"tcp/{size}/{d}/random") if pat == "random" else None
                if t:
                    v = r["median_s"] / t["median_s"]
                    add(f"ucx {size} {d} random vs kvblocks tcp", f"{v:.2f}x", "report", True,
                        f"{r['median_s'] * 1e6:.1f} us vs {t['median_s'] * 1e6:.1f} us (same run)")


def _inprocess(by, add):
    r = by.get("dispatch/pull-16x16B")
    if r:
        add("in-process dispatch, 16 blocks", f"{r['median_s'] * 1e6:.2f} us", "<= 1 us", r["median_s"] <= 1e-6,
            "validation + call, ndarray ids, 16-byte blocks")
    r = by.get("validation/ndarray/1048576")
    if r:
        v = r["median_s"] / r["blocks"] * 1e9
        add("validation at 1M blocks", f"{v:.2f} ns/block", "<= 2 ns/block", v <= 2, "numpy uint64 ids")
    r = by.get("import/kvblocks")
    if r:
        add("import kvblocks", f"{r['median_s'] * 1e3:.1f} ms", "<= 15 ms, no numpy",
            r["median_s"] <= 15e-3 and not r.get("bad_blocks"),
            "numpy imported!" if r.get("bad_blocks") else "numpy not imported")


def _async(by, add):
    r = by.get("async/submit-16x16B")
    if r and r.get("paired_baseline_median_s"):
        v = r["median_s"] - r["paired_baseline_median_s"]
        add("async submit, 16 blocks, over validation", f"{v * 1e6:+.2f} us", "<= +2 us", v <= 2e-6,
            f"{r['median_s'] * 1e6:.2f} us vs validate_blocks {r['paired_baseline_median_s'] * 1e6:.2f} us "
            "(interleaved)")
    r = by.get("async/tcp-64-inflight")
    if r and r.get("ratio"):
        v = 1 / r["ratio"]
        add("tcp 64 small pulls in flight vs sequential", f"{v:.2f}x", ">= 4x", v >= 4,
            f"{r['median_s'] * 1e3:.2f} ms vs {_base_med(r, by) * 1e3:.2f} ms (interleaved)")


def _hixl(by, add):
    for key, r in sorted(by.items()):
        if key.startswith("hixl/") and key.endswith("/transfer_sync") and r.get("ratio"):
            v = r["ratio"]
            add(f"hixl transfer_sync vs native pull, {key.split('/')[1]} {key.split('/')[2]}", f"{v:.3f}x",
                "<= 1.10x", v <= 1.10,
                f"{r['median_s'] * 1e6:.1f} us vs {_base_med(r, by) * 1e6:.1f} us (interleaved)")
def _layerwise(by, add):
    from .cases_layerwise import LAYERS, hidden_fraction

    c, s, p = (by.get(f"layerwise/{k}-{LAYERS}") for k in ("compute", "serial", "pipeline"))
    if c and s and p:
        v = hidden_fraction(c["median_s"], s["median_s"], p["median_s"])
        add("layer-wise pipeline hides transfer time", f"{v * 100:.0f} %", ">= 80 %", v >= 0.8,
            f"pipeline {p['median_s'] * 1e3:.1f} ms vs serial {s['median_s'] * 1e3:.1f} ms vs compute alone "
            f"{c['median_s'] * 1e3:.1f} ms (medians, interleaved rounds)")


def targets(rows, peer_rows):
    """[{"target", "value", "goal", "ok", "detail"}] for every target whose rows were measured.
    Raises nothing."""
    by = {r["id"]: r for r in rows if r.get("median_s")}
    pe = {r["id"]: r for r in peer_rows if r.get("median_s")}
    out = []

    def add(name, value, goal, ok, detail):
        out.append({"target": name, "value": value, "goal": goal, "ok": ok, "detail": detail})

    _samehost(by, pe, add)
    _limits(by, add)
    _tcp(by, add)
    _integrity(by, add)
    _encryption(by, add)
    _ucx(by, pe, add)
    _inprocess(by, add)
    _async(by, add)
    _hixl(by, add)
    _layerwise(by, add)
    return out
