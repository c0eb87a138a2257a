# SPDX-License-Identifier: Apache-2.0
"""Against the machine's limits: same-host transfers beside a memcpy split over every core, CMA at
2-32 MiB beside a plain process_vm_readv loop, and transfers shaped like public models' KV caches."""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["limits", "model"]), ids=str)
def test_limits(run_case, case):
    run_case(case)
