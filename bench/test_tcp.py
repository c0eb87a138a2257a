# SPDX-License-Identifier: Apache-2.0
"""kvblocks.Transport=tcp, the same cases as same-host; baselines: a raw loopback socket sending
the same bytes to the peer process, and a raw 8-byte ping-pong."""
import pytest

from kvblocks.bench import cases_for


@pytest.mark.parametrize("case", cases_for(["tcp"]), ids=str)
def test_tcp(run_case, case):
    run_case(case)
