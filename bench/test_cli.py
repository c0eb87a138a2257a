# SPDX-License-Identifier: Apache-2.0
"""``python -m kvblocks bench`` end to end on a few quick cases: table, targets, JSON."""
import json
import os
import subprocess
import sys


def _run(tmp_path, *args):
    import kvblocks

    env = dict(os.environ)  # the child imports the same kvblocks as this process
    root = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "kvblocks", "bench", *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


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
