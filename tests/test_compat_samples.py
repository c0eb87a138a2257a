# SPDX-License-Identifier: Apache-2.0
"""CANN-style two-process sample programs, run unchanged through ``python -m kvblocks.compat``."""
import os
import shutil
import subprocess
import sys
import time

import pytest

import kvblocks
from procs import run_together

np = pytest.importorskip("numpy")
from ports import free_port  # noqa: E402

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat_samples")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))



def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_processes(sample, arg_lists, tmp_path, timeout=90):
    """Runs one `python -m kvblocks.compat sample ...` per arg list; all must exit 0. One that fails
    fails the test at once (the others would wait out their barrier timeouts for it)."""
    cmds = [[sys.executable, "-m", "kvblocks.compat", os.path.join(SAMPLES, sample), *map(str, args),
             "--sync", str(tmp_path)] for args in arg_lists]
    names = [f"{sample} {' '.join(map(str, args))}" for args in arg_lists]
    return run_together(cmds, timeout, names, env=_env(), cwd=str(tmp_path))


def test_decoder_links_and_pulls(tmp_path):
    port = free_port()
    outs = run_processes("pull_blocks_sample.py", [["--role", "prompt", "--port", port],
                                                   ["--role", "decoder", "--port", port]], tmp_path)
    assert "all data verified" in outs[1]


def test_prompt_pushes_with_layer_ranges(tmp_path):
    port = free_port()
    outs = run_processes("push_blocks_sample.py", [["--role", "prompt", "--port", port],
                                                   ["--role", "decoder", "--port", port]], tmp_path)
    assert "all data verified" in outs[1]


def test_switch_role_then_reverse(tmp_path):
    p1, p2 = free_port(), free_port()
    outs = run_processes("switch_role_sample.py", [["--role", "prompt", "--port", p1, "--port2", p2],
                                                   ["--role", "decoder", "--port", p1, "--port2", p2]], tmp_path)
    assert all("all data verified" in o for o in outs)


def test_xpyd_two_prompts_one_decoder(tmp_path):
    p0, p1 = free_port(), free_port()
    outs = run_processes("xpyd_sample.py", [["--role", "prompt", "--index", 0, "--ports", p0, p1],
                                            ["--role", "prompt", "--index", 1, "--ports", p0, p1],
                                            ["--role", "decoder", "--index", 0, "--ports", p0, p1]], tmp_path)
    assert "all data verified" in outs[2]


def test_mutual_link_pull_while_push(tmp_path):
    pa, pb = free_port(), free_port()
    outs = run_processes("mutual_link_sample.py", [["--side", "a", "--ports", pa, pb],
                                                   ["--side", "b", "--ports", pa, pb]], tmp_path)
    assert all("all data verified" in o for o in outs)


def test_hixl_server_client_read_write_notify(tmp_path):
    """hixl (import hixl under kvblocks.compat): the D2RD flow (H44: 8 MiB as 512 x 16 KiB READ), then
    a WRITE and a notification the server sees only after the written bytes landed."""
    from ports import _bindable
    while True:
        sp = free_port()
        if _bindable(sp + 1000):
            break
    cp = free_port()
    outs = run_processes("hixl_d2rd_sample.py", [["--role", "server", "--port", sp],
                                                 ["--role", "client", "--port", cp, "--server-port", sp]], tmp_path)
    assert "notification after the write verified" in outs[0]
    assert "8 MiB read verified" in outs[1] and "all data verified" in outs[1]
def test_transfer_cache_async_with_a_layer_synchronizer(tmp_path):
    # hixl.md 3.5 (transfer_cache_async_sample): the prompt pushes layer by layer, B2B, by BlocksCacheKey.
    port = free_port()
    outs = run_processes("transfer_cache_async_sample.py", [["--role", "prompt", "--port", port],
                                                            ["--role", "decoder", "--port", port]], tmp_path)
    assert "all data verified" in outs[1]


def test_pull_cache_of_two_keys_into_two_batches(tmp_path):
    # hixl.md 3.5 (pull_cache_sample) and 3.4: cache_keys[i] -> batch i; a consumed key is gone.
    port = free_port()
    outs = run_processes("pull_cache_keys_sample.py", [["--role", "prompt", "--port", port],
                                                       ["--role", "decoder", "--port", port]], tmp_path)
    assert "all data verified" in outs[1]


def test_pull_by_keys_the_prompt_bound_after_the_link(tmp_path):
    # issue 31: CacheKey and BlocksCacheKey of caches allocated after link_clusters (asked for once).
    port = free_port()
    outs = run_processes("late_keys_sample.py", [["--role", "prompt", "--port", port],
                                                 ["--role", "decoder", "--port", port]], tmp_path)
    assert "all data verified" in outs[1]


def test_pull_blocks_from_a_contiguous_cache(tmp_path):
    # hixl.md 3.5 (pull_from_cache_to_blocks): a batch row cut into local blocks.
    port = free_port()
    outs = run_processes("pull_cache_to_blocks_sample.py", [["--role", "prompt", "--port", port],
                                                            ["--role", "decoder", "--port", port]], tmp_path)
    assert "all data verified" in outs[1]


def test_a_failing_sample_fails_the_test_at_once(tmp_path):
    # The decoder raises at start (its port is out of range); the prompt would wait 60 s for it. The
    # harness notices the exit and fails within seconds, naming the process, its exit code and error.
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as e:
        run_processes("pull_blocks_sample.py", [["--role", "prompt", "--port", port],
                                                ["--role", "decoder", "--port", 70000]], tmp_path)
    elapsed = time.monotonic() - t0
    assert elapsed < 10, elapsed
    msg = str(e.value)
    assert msg.startswith("pull_blocks_sample.py --role decoder --port 70000 exit code 1:\n"), msg
    assert "Traceback" in msg and "70000" in msg, msg


def test_samples_pass_mypy_strict(tmp_path):
    pytest.importorskip("mypy")
    stubs = os.path.join(SAMPLES, "stubs")
    files = sorted(os.path.join(SAMPLES, f) for f in os.listdir(SAMPLES) if f.endswith(".py"))
    env = _env()
    paths = [stubs, SAMPLES]
    if os.path.basename(PKG_ROOT) not in ("site-packages", "dist-packages"):
        paths.append(PKG_ROOT)  # a source checkout; an installed kvblocks is found through py.typed
    env["MYPYPATH"] = os.pathsep.join(paths)
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", os.devnull,
           "--python-executable", sys.executable, *files]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
