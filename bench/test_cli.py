# SPDX-License-Identifier: Apache-2.0
"""``python -m kvblocks bench`` end to end on a few quick cases: table, targets, JSON."""
import json
import os
import subprocess
import sys

import pytest


def _env():
    """The environment of a child that imports the same kvblocks and kvblocks_bench as this process."""
    import kvblocks
    import kvblocks_bench

    env = dict(os.environ)
    roots = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))) for m in (kvblocks, kvblocks_bench)]
    env["PYTHONPATH"] = os.pathsep.join(roots + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _run(tmp_path, *args):
    env = _env()
    return subprocess.run([sys.executable, "-m", "kvblocks", "bench", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def _run_json(tmp_path, *args):
    """Runs the bench with ``args`` --quick and returns its JSON rows by id and targets by name."""
    out = tmp_path / "r.json"
    r = _run(tmp_path, *args, "--quick", "--json", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    return {x["id"]: x for x in data["results"]}, {t["target"]: t for t in data["targets"]}


def test_cli_json_and_targets(tmp_path):
    out = tmp_path / "r.json"
    r = _run(tmp_path, "--case", "dispatch/pull-16x16B", "--case", "shm/small/pull/random", "--quick",
             "--json", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "targets" in r.stdout and "shm/small/pull/random" in r.stdout
    data = json.loads(out.read_text())
    rows = {x["id"]: x for x in data["results"]}
    # baselines come along and each case has a ratio to the baseline measured beside it
    assert {"dispatch/memcpy-256B", "base/gather/small/random"} <= set(rows)
    assert rows["shm/small/pull/random"]["bad_blocks"] == 0
    assert rows["shm/small/pull/random"]["ratio"] > 0
    assert data["meta"]["cores"] >= 1 and data["targets"]


def test_cli_list_and_bad_case(tmp_path):
    r = _run(tmp_path, "--list")
    assert r.returncode == 0 and "tcp/large/pull/random" in r.stdout
    r = _run(tmp_path, "--case", "no-such-case")
    assert r.returncode != 0 and "no case matches" in (r.stdout + r.stderr)


def test_summary_of_runs(tmp_path):
    """Two real quick runs side by side: every target once per run, with its median and hold count."""
    paths = []
    for i in (1, 2):
        p = tmp_path / f"r{i}.json"
        r = _run(tmp_path, "--case", "dispatch/pull-16x16B", "--quick", "--json", str(p), "--no-progress")
        assert r.returncode == 0, r.stderr
        paths.append(str(p))
    from kvblocks_bench import summary

    runs = [json.loads(open(p).read()) for p in paths]
    table = summary.targets_table(runs)
    row = next(line for line in table.splitlines() if line.startswith("| in-process dispatch"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].endswith("us") and cells[3].endswith("us")  # run 1, run 2
    assert float(cells[4]) > 0 and cells[5] in {"0 of 2", "1 of 2", "2 of 2"}
    assert summary.runs_table(runs).count("\n") == 3  # header, rule, two runs


def test_summary_cli_help_and_bad_files(tmp_path):
    """``--help`` prints usage (it was once read as a file name); a missing or foreign file is an
    argparse error naming the file, exit 2, not a traceback."""
    run = [sys.executable, "-m", "kvblocks_bench.summary"]
    h = subprocess.run(run + ["--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60, env=_env())
    assert h.returncode == 0 and "RUN.json" in h.stdout
    missing = subprocess.run(run + ["nope.json"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                             env=_env())
    assert missing.returncode == 2 and "nope.json" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "other.json").write_text("{}")
    foreign = subprocess.run(run + ["other.json"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                             env=_env())
    assert foreign.returncode == 2 and "not a kvblocks bench --json file" in foreign.stderr


def test_cli_reports_limits_and_model_shapes(tmp_path):
    """The limits and model-shaped cases have tables of their own in the Markdown report (and the
    console), not only rows in the JSON."""
    md = tmp_path / "r.md"
    r = _run(tmp_path, "--case", "limits/cma/2MiB/pull", "--case", "model/qwen2.5-7b/shm/pull", "--quick",
             "--markdown", str(md), "--no-progress")
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    limits, model = text.index("### At the limits"), text.index("### Model-shaped transfers")
    assert limits < text.index("| limits/cma/2MiB/pull") < model < text.index("| model/qwen2.5-7b/shm/pull")
    assert "model/qwen2.5-7b/shm/pull" in r.stdout


def _masks(pid):
    """The distinct CPU masks of the threads of ``pid``."""
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.parametrize("place", ["one_cpu", "two_cpus"])
def test_placement_pins_both_ends_and_frees_them(place):
    """The one-cpu cases put every thread of the bench and of its tcp peer on one CPU, the two-cpu
    cases the bench's on its first CPU and the peer's on its last; both give every CPU back after
    the row."""
    import kvblocks_bench as kbb

    h = kbb.Harness()
    try:
        _, peer = h.link("tcp")
        start = os.sched_getaffinity(0)
        getattr(h, place)(True)
        theirs = min(start) if place == "one_cpu" else max(start)
        assert _masks(os.getpid()) == {frozenset({min(start)})}
        assert _masks(peer.proc.pid) == {frozenset({theirs})}
        getattr(h, place)(False)
        for pid in (os.getpid(), peer.proc.pid):
            assert _masks(pid) == {frozenset(start)}, pid
    finally:
        h.close()


def test_cpu_load_busies_every_cpu_even_after_one_cpu():
    """The loaded cases run one busy loop on each CPU the bench started with, also when the bench
    itself is pinned to one CPU first (loaded/one-cpu): the loops must not inherit that pin."""
    import kvblocks_bench as kbb

    h = kbb.Harness()
    try:
        start = os.sched_getaffinity(0)
        h.one_cpu(True)
        h.cpu_load(True)
        masks = sorted(tuple(sorted(os.sched_getaffinity(p.pid))) for p in h.load)
        assert masks == [(c,) for c in sorted(start)]
        h.cpu_load(False)
        assert h.load == []
    finally:
        h.one_cpu(False)  # or a failed assertion leaves this process on one CPU for later tests
        h.close()


@pytest.mark.parametrize("suffix,say", [("one-cpu", "(both ends on one CPU)"),
                                         ("two-cpu", "(each end on its own CPU)"),
                                         ("loaded/one-cpu", "(both CPUs busy, both ends on one CPU)"),
                                         ("loaded/two-cpu", "(both CPUs busy, each end on its own CPU)")])
def test_cli_placed_round_trip_target(tmp_path, suffix, say):
    """The 16 x 4 KiB pull with both ends placed, idle or loaded, is measured beside the ping-pong
    placed alike."""
    out = tmp_path / "r.json"
    case = f"tcp/small/pull/random/{suffix}"
    r = _run(tmp_path, "--case", case, "--quick", "--json", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    rows = {x["id"]: x for x in data["results"]}
    assert rows[case]["baseline"] == f"tcp/raw-pingpong-8B/{suffix}"
    assert rows[case]["ratio"] > 0
    assert any(t["target"].endswith(say) for t in data["targets"])


def test_cli_cma_is_timed_beside_shm_and_the_kernel_floor(tmp_path):
    """The cma vs shm target comes from rounds both cases shared, not from two separate medians, and
    so does the kernel's floor (process_vm_readv on every CPU) it is reported with."""
    out = tmp_path / "r.json"
    r = _run(tmp_path, "--case", "cma/large/pull/random", "--case", "shm/large/pull/random",
             "--case", "base/raw-cma-all/large/pull/random", "--quick", "--json", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    rows = {x["id"]: x for x in data["results"]}
    for other in ("shm/large/pull/random", "base/raw-cma-all/large/pull/random"):
        paired = rows["cma/large/pull/random"]["beside"][other]
        assert paired["median_s"] > 0 and paired["ratio"] > 0
    targets = {t["target"]: t for t in data["targets"]}
    assert "(interleaved); the kernel's floor, all cores: " in targets["cma large pull vs shm"]["detail"]
    assert "(interleaved)" in targets["cma large pull vs process_vm_readv on all cores"]["detail"]


def test_raw_cma_floor_moves_the_blocks_from_one_pinned_thread_per_cpu():
    """The kernel's-floor baseline copies every block (process_vm_readv from the peer's arrays) from
    one thread per CPU, each pinned to its own CPU."""
    import kvblocks_bench as kbb
    from kvblocks_bench import baselines as bl
    from kvblocks_bench.markers import check_blocks

    h = kbb.Harness()
    try:
        p = h.pair("cma", 2, 8, 4096)
        ids = list(range(8))
        p.peer.call("mark", p.rkey, ids, 77)
        before = set(os.listdir("/proc/self/task"))
        cpus = sorted(os.sched_getaffinity(0))
        fn = bl.raw_cma_fn(p, "pull", "contig", 8, threads=len(cpus))
        fn()  # its threads stay (with fn) for the next call
        new = set(os.listdir("/proc/self/task")) - before
        masks = [os.sched_getaffinity(int(t)) for t in new]
        assert all(len(m) == 1 for m in masks) and sorted(min(m) for m in masks) == cpus, masks
        assert check_blocks(p.arrays, ids, ids, 77) == 0  # every block landed
    finally:
        h.close()


def test_raw_cma_floor_repeats_each_share_in_a_row(monkeypatch):
    """With ``repeat`` the floor's threads each copy their share of that many calls per sample: one
    syscall per thread and call here, and the blocks land."""
    import kvblocks_bench as kbb
    from kvblocks_bench import baselines as bl
    from kvblocks_bench.markers import check_blocks

    made = bl._cma_call
    calls = []

    def counting(direction):
        f, errno = made(direction)

        def counted(*a):
            calls.append(a[2])
            return f(*a)
        return counted, errno

    monkeypatch.setattr(bl, "_cma_call", counting)
    h = kbb.Harness()
    try:
        p = h.pair("cma", 2, 8, 4096)
        ids = list(range(8))
        p.peer.call("mark", p.rkey, ids, 78)
        fn = bl.raw_cma_fn(p, "pull", "contig", 8, threads=2, repeat=3)
        fn()
        assert sorted(calls) == [8] * 6  # 2 threads x 3 calls, each thread's half of 16 blocks
        assert check_blocks(p.arrays, ids, ids, 78) == 0
    finally:
        h.close()


def test_cli_mid_cma_is_timed_beside_the_kernel_floor(tmp_path):
    """The 2 MiB cma case is timed beside process_vm_readv on every CPU, 32 calls in a row per
    sample, and its target reports that floor by bandwidth."""
    rows, targets = _run_json(tmp_path, "--case", "limits/cma/2MiB/pull", "--case", "base/raw-cma-all/2MiB/pull")
    assert rows["base/raw-cma-all/2MiB/pull"]["bytes"] == 32 * rows["limits/cma/2MiB/pull"]["bytes"]
    assert rows["limits/cma/2MiB/pull"]["beside"]["base/raw-cma-all/2MiB/pull"]["median_s"] > 0
    detail = targets["cma 2MiB pull vs process_vm_readv loop"]["detail"]
    v = float(detail.split("the kernel's floor, all cores: ")[1].rstrip("x"))
    assert 0.5 < v < 4  # a bandwidth ratio, not one of medians over unequal bytes


def test_cli_tcp_large_is_timed_beside_c_streams_both_ways(tmp_path):
    """Each tcp large transfer is compared with the C stream that runs its own way (the peer's
    send() for a pull), timed in the same rounds, and the pull/push target reports the streams' own
    ratio from the push's rounds."""
    rows, targets = _run_json(tmp_path, "--case", "tcp/large/*/random", "--case", "tcp/raw-*-c/large")
    for d in ("pull", "push"):
        assert set(rows[f"tcp/large/{d}/random"]["beside"]) == {"tcp/raw-recv-c/large", "tcp/raw-send-c/large"}
        assert "(interleaved)" in targets[f"tcp large {d} random vs raw C stream the same way, 1 MiB writes"]["detail"]
    assert "; the raw C streams, same rounds: " in targets["tcp large pull vs push time"]["detail"]


@pytest.mark.parametrize("load,say", [("", ""), ("/loaded", " (both CPUs busy)")])
def test_unpinned_round_trip_target_names_the_placed_round_trips(load, say):
    """The unpinned 16 x 4 KiB target, idle or loaded, reports the one-CPU and two-CPU ping-pongs
    and pulls of the same run and load (the scheduler may place the two round trips differently);
    the placed targets do not."""
    from kvblocks_bench.targets import targets

    rows = [{"id": f"tcp/raw-pingpong-8B{load}", "median_s": 20e-6},
            {"id": f"tcp/small/pull/random{load}", "median_s": 76e-6, "ratio": 3.8,
             "paired_baseline_median_s": 20e-6}]
    for place, ping, pull in (("one-cpu", 14.6e-6, 30.1e-6), ("two-cpu", 75.7e-6, 52e-6)):
        rows += [{"id": f"tcp/raw-pingpong-8B{load}/{place}", "median_s": ping},
                 {"id": f"tcp/small/pull/random{load}/{place}", "median_s": pull, "ratio": pull / ping,
                  "paired_baseline_median_s": ping}]
    rows.append({"id": "tcp/raw-pingpong-8B" + ("" if load else "/loaded") + "/one-cpu", "median_s": 1e-3})
    got = {t["target"]: t["detail"] for t in targets(rows, [])}
    assert got[f"tcp small pull random vs ping-pong RTT{say}"].endswith(
        "; placed on one CPU / on two (same run): ping-pong 14.6 / 75.7 us, pull 30.1 / 52.0 us")
    busy = "both CPUs busy, " if load else ""
    assert "placed" not in got[f"tcp small pull random vs ping-pong RTT ({busy}each end on its own CPU)"]
