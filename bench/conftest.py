# SPDX-License-Identifier: Apache-2.0
"""pytest-benchmark suite: ``pytest bench/`` (not part of the normal ``pytest`` run, testpaths=tests).

Every case comes from ``kvblocks_bench`` (the same matrix as ``python -m kvblocks bench``), so the
two never disagree on what a case moves. The peer is a real second process (multiprocessing
spawn) holding its own LlmDataDist; one per transport, shared by the whole session. Each
transfer case also checks once that the moved blocks are the right ones.
"""
import pytest

_GET = "pip install ./bench '.[bench]' (in a kvblocks checkout)"
pytest.importorskip("numpy", reason=f"the benchmarks need numpy: {_GET}")
pytest.importorskip("pytest_benchmark", reason=f"the benchmarks need pytest-benchmark: {_GET}")

import kvblocks_bench as kbb  # noqa: E402

# rounds for slow (large) cases, timed one call per round after warm-up calls
LARGE_ROUNDS = 10


@pytest.fixture(scope="session")
def harness():
    h = kbb.Harness()
    yield h
    h.close()


@pytest.fixture
def run_case(benchmark, harness):
    """Benchmarks one case in its group (baseline rows join the group of the file using them)."""

    def run(case, group=None):
        try:
            _run(case, group)
        finally:  # a loaded or one-cpu case undoes its setting, as in the CLI
            if case.after is not None:
                case.after(harness)

    def _run(case, group):
        fn, verify = case.make(harness)
        benchmark.group = group if (group and case.group == "base") else case.pgroup
        benchmark.extra_info.update(bytes=case.bytes, blocks=case.blocks, baseline=case.baseline or "",
                                    path=case.path, note=case.note)
        if case.custom is not None or case.reps == "large":
            warm = 1 if case.custom is not None else kbb.REPS["large"][0]
            benchmark.pedantic(fn, rounds=LARGE_ROUNDS, warmup_rounds=warm, iterations=1)
        else:
            benchmark(fn)
        if case.path in ("shm", "cma", "tcp"):
            benchmark.extra_info["link_path"] = harness.link_path(kbb.TRANSPORT[case.path])
        if verify is not None:
            bad = verify()
            benchmark.extra_info["bad_blocks"] = bad
            assert bad == 0, f"{case.id}: {bad} wrong blocks" if case.group != "import" else "import pulled in numpy"

    return run
