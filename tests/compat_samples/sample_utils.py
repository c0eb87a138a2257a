# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the samples: a file barrier between the two processes and the data pattern."""
import os
import time

import numpy as np
import numpy.typing as npt

WAIT_TIMEOUT_S = 60.0


def signal(sync_dir: str, name: str) -> None:
    with open(os.path.join(sync_dir, name), "w") as f:
        f.write("1")


def wait_for(sync_dir: str, name: str, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    path = os.path.join(sync_dir, name)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {name}")
        time.sleep(0.01)


def pattern(owner: int, tensor: int, shape: "tuple[int, ...]") -> npt.NDArray[np.int32]:
    """Distinct INT32 content per owner, tensor, block and element."""
    n = int(np.prod(shape))
    base = owner * 1_000_000 + tensor * 10_000
    return (np.arange(n, dtype=np.int32) + np.int32(base)).reshape(shape)


def assert_equal(what: str, got: npt.NDArray[np.int32], want: npt.NDArray[np.int32]) -> None:
    if got.tobytes() != want.tobytes():
        raise AssertionError(f"{what}: data differs\n got={got}\nwant={want}")
