# SPDX-License-Identifier: Apache-2.0
"""Layer-wise pipeline (group layerwise): 80 layers pushed over TCP behind a simulated compute
(time.sleep of one layer's transfer time), vs compute then push (serial) and vs compute alone."""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["layerwise"]), ids=str)
def test_layerwise(run_case, case):
    run_case(case)
