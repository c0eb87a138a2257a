# SPDX-License-Identifier: Apache-2.0
"""Asynchronous transfers (group async): submission cost vs validate_blocks of the same lists, and
64 small TCP pulls in flight vs 64 sequential synchronous pulls."""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["async"]), ids=str)
def test_async(run_case, case):
    run_case(case)
