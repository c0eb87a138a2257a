# SPDX-License-Identifier: Apache-2.0
"""kvblocks_bench.timing: how interleaved sides take their turns."""
from kvblocks_bench.timing import LocalSide, measure_interleaved


def test_no_side_always_follows_the_same_one():
    """No side always follows the same one: a side that leaves the CPU busy after its turn (a peer
    engine's threads) must not always cost the same neighbour."""
    log = []
    sides = [LocalSide(lambda k=k: log.append(k), False) for k in range(3)]
    out = measure_interleaved(sides, "small", scale=0.1)
    assert all(len(x) >= 20 for x in out)
    calls = [k for i, k in enumerate(log) if i == 0 or log[i - 1] != k]  # one entry per turn
    before = {k: {calls[i - 1] for i in range(1, len(calls)) if calls[i] == k} for k in range(3)}
    assert all(len(b) == 2 for b in before.values()), before
