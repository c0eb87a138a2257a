# SPDX-License-Identifier: Apache-2.0
"""Block-list checks at 16, 1k, 64k and 1M blocks vs a pure-Python loop (group validation-N),
and the in-process dispatch of pull_kv_blocks vs a memcpy of the same bytes (group dispatch)."""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["validation"]), ids=str)
def test_validation(run_case, case):
    run_case(case)


@pytest.mark.parametrize("case", cases_for(["dispatch"]), ids=str)
def test_dispatch(run_case, case):
    run_case(case)


@pytest.mark.parametrize("case", cases_for(["import"]), ids=str)
def test_import(run_case, case):
    run_case(case)
