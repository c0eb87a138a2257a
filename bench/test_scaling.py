# SPDX-License-Identifier: Apache-2.0
"""Scaling: time vs bytes per call (shm, cma, tcp), vs blocks per call at fixed bytes (16 MiB)
and at a fixed 64-byte block size up to 1M blocks, and vs layers. Baseline: memcpy of the bytes."""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["scaling"]), ids=str)
def test_scaling(run_case, case):
    run_case(case, group="scaling-memcpy")
