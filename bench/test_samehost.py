# SPDX-License-Identifier: Apache-2.0
"""Same-host cross-process pull and push, small and large, random and contiguous ids.

shm: runtime-allocated caches (memfd shared memory mapped by the peer); cma: registered numpy
arrays (process_vm_readv/writev). Baselines in the same group: numpy memcpy of the same bytes
and a numpy block gather (np.take) of the same blocks.
"""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["shm", "cma"], extra=("base/memcpy/64KiB", "base/memcpy/256MiB")), ids=str)
def test_samehost(run_case, case):
    run_case(case)
