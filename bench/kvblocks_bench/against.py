# SPDX-License-Identifier: Apache-2.0
"""``kvblocks bench --against REF``: this build against another, in alternating rounds.

REF is a wheel (``.whl``), a folder holding a built ``kvblocks`` package (an in-place build), or a
git commit of the checkout in the current directory, which is exported and built in place once
(needs Cython and setuptools; kept under ``$XDG_CACHE_HOME/kvblocks-bench``). Each round runs
``against_worker.py`` for every path (shm, cma, tcp) under both builds, one after the other, in an
order that alternates between rounds; a case's ratio in a round is this build's median time over
the reference's. The table gives the median ratio over the rounds, its spread, and how many rounds
this build was slower in; a case whose median ratio is further from 1 than the spread of its ratios
is marked ``SLOWER`` or ``faster``.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "against_worker.py")
PATHS = ("shm", "cma", "tcp")
MIN_SPREAD = 0.02  # a ratio within 2 % of 1 is parity however steady the rounds were


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvblocks-bench")


def _built(folder):
    pkg = os.path.join(folder, "kvblocks")
    return os.path.isfile(os.path.join(pkg, "__init__.py")) and any(
        n.startswith("_lib") and n.endswith(".so") for n in os.listdir(pkg))


def _from_wheel(whl):
    dst = os.path.join(_cache_dir(), "wheel-" + os.path.basename(whl)[:-4])
    if not _built(dst):
        shutil.rmtree(dst, ignore_errors=True)
        with zipfile.ZipFile(whl) as z:
            z.extractall(dst)
    return dst


def _from_commit(ref):
    try:
        sha = subprocess.run(["git", "rev-parse", "--verify", ref + "^{commit}"], check=True,
                             capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise ValueError(f"--against {ref!r}: not a wheel, a built folder or a git commit here ({e})") from None
    dst = os.path.join(_cache_dir(), "commit-" + sha[:12])
    if _built(dst):
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    archive = subprocess.run(["git", "archive", sha], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dst], input=archive, check=True)
    print(f"building {ref} ({sha[:12]}) in {dst} ...", file=sys.stderr)
    log = os.path.join(dst, "build.log")
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=dst, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0 or not _built(dst):
        raise RuntimeError(f"building {ref} failed (needs Cython and setuptools); see {log}")
    return dst


def prepare(ref):
    """The folder to put on PYTHONPATH for the reference build REF.

    Raises:
        ValueError: REF is no wheel, built folder or commit of the repository in the working directory.
        RuntimeError: the commit did not build.
    """
    if ref.endswith(".whl") and os.path.isfile(ref):
        return _from_wheel(ref)
    if os.path.isdir(ref):
        if not _built(ref):
            raise ValueError(f"--against {ref!r}: the folder holds no built kvblocks package")
        return os.path.abspath(ref)
    return _from_commit(ref)


def current():
    """The folder this process imports kvblocks from (raises nothing)."""
    import kvblocks
    return os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))


def _run_worker(folder, path, scale):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVBLOCKS_")}
    env["PYTHONPATH"] = folder
    p = subprocess.run([sys.executable, WORKER, path, scale], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tempfile.gettempdir())
    if p.returncode != 0 or not p.stdout.strip():
        raise RuntimeError(f"the {path} worker on {folder} failed (exit {p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if not os.path.abspath(out["kvblocks"]).startswith(os.path.abspath(folder) + os.sep):
        raise RuntimeError(f"the worker for {folder} imported {out['kvblocks']} instead")
    return out


def run(ref, rounds=8, paths=PATHS, quick=False, progress=True):
    """Measures both builds in ``rounds`` alternating rounds; returns ``{"meta", "cases"}``.

    Raises:
        ValueError, RuntimeError: from :func:`prepare`, or a worker that failed or moved wrong bytes.
    """
    builds = {"this": current(), "ref": prepare(ref)}
    per = {"this": {}, "ref": {}}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        order = ("this", "ref") if r % 2 == 0 else ("ref", "this")
        for path in paths:
            for who in order:
                out = _run_worker(builds[who], path, "quick" if quick else "full")
                if out["bad"]:
                    raise RuntimeError(f"{who} build moved wrong bytes on {path}")
                for case, (med, _, _) in out["results"].items():
                    per[who].setdefault(case, []).append(med)
        load.append(os.getloadavg()[0])
        if progress:
            print(f"round {r + 1}/{rounds} done (load {load[-1]:.2f})", file=sys.stderr)
    cases = {}
    for case, mine in per["this"].items():
        theirs = per["ref"][case]
        ratios = sorted(a / b for a, b in zip(mine, theirs))
        med = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [ratios[0], med, ratios[-1]]
        spread = max((q[2] - q[0]) / 2, MIN_SPREAD)
        verdict = "SLOWER" if med - 1 > spread else "faster" if 1 - med > spread else "parity"
        cases[case] = {"this_s": statistics.median(mine), "ref_s": statistics.median(theirs), "ratio": med,
                       "ratio_min": ratios[0], "ratio_max": ratios[-1], "spread": spread,
                       "slower_rounds": sum(x > 1 for x in ratios), "rounds": len(ratios), "verdict": verdict}
    meta = {"ref": ref, "ref_folder": builds["ref"], "this_folder": builds["this"], "rounds": rounds,
            "load_min": min(load), "load_max": max(load), "cpus": os.cpu_count()}
    return {"meta": meta, "cases": cases}


def _fmt_time(s):
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def report(res):
    """The result of :func:`run` as a text table (raises nothing)."""
    m = res["meta"]
    lines = [f"this build: {m['this_folder']}", f"reference:  {m['ref']} ({m['ref_folder']})",
             f"{m['rounds']} alternating rounds, {m['cpus']} CPUs, load average {m['load_min']:.2f}-"
             f"{m['load_max']:.2f}", "ratio = this build's median time / the reference's, per round; "
             "median over rounds [min-max]; spread = half the interquartile range of the ratios", "",
             f"{'case':<18} {'this':>10} {'ref':>10} {'ratio':>7} {'min-max':>13} {'spread':>7} "
             f"{'slower in':>10}  verdict"]
    for case, c in res["cases"].items():
        lines.append(f"{case:<18} {_fmt_time(c['this_s']):>10} {_fmt_time(c['ref_s']):>10} {c['ratio']:>7.3f} "
                     f"{c['ratio_min']:>6.2f}-{c['ratio_max']:<6.2f} {c['spread']:>7.3f} "
                     f"{c['slower_rounds']:>4}/{c['rounds']:<5}  {c['verdict']}")
    return "\n".join(lines)


def main(ref, rounds, paths, quick, json_file, progress):
    """Runs the comparison and prints it; returns 0, or 2 when REF cannot be prepared.

    Raises:
        RuntimeError: a worker failed or moved wrong bytes.
        OSError: the JSON file cannot be written.
    """
    try:
        res = run(ref, rounds, paths, quick, progress)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(report(res))
    if json_file:
        with open(json_file, "w") as f:
            json.dump(res, f, indent=1)
    return 0
