# SPDX-License-Identifier: Apache-2.0
"""kvblocks.Transport=tcp, the same cases as same-host; baselines: a raw loopback socket sending
the same bytes to the peer process, a raw 8-byte ping-pong, and the 16 x 4 KiB pull's blocks
over a raw socket."""
import pytest

from kvblocks_bench import cases_for


@pytest.mark.parametrize("case", cases_for(["tcp"]), ids=str)
def test_tcp(run_case, case):
    run_case(case)


def test_raw_blocks_baseline_moves_the_blocks_it_names(harness, monkeypatch):
    """The raw-socket floor of the 16 x 4 KiB pull really moves those blocks: each destination
    block holds its source block's byte. Negative control: expecting other bytes here (the peer
    process, unpatched, still sends the right ones) counts every block as wrong."""
    from kvblocks_bench import baselines as bl

    fn, verify = bl.raw_blocks_case().make(harness)
    fn()
    assert verify() == 0
    monkeypatch.setattr(bl, "block_byte", lambda i: i % 251 + 2)
    assert verify() == 16
