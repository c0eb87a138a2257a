# SPDX-License-Identifier: Apache-2.0
"""Server 2's launcher in the end-to-end test: ``python -m kvblocks.lmcache`` with two test hooks in the
kvblocks channel's client. Same arguments as the launcher.

- Negative control: while the file named by ``KVBLOCKS_TEST_CORRUPT_FLAG`` exists (unset: always), each
  object a read landed is XORed with 0x55 (every other byte) before the read is reported finished. If the
  second engine's tokens do not change with it, the test proves nothing about the channel.
- Faults at the read: once the file named by ``KVBLOCKS_TEST_FAULT_FILE`` exists, holding ``STOP <pid>`` or
  ``KILL <pid>``, the next read first freezes or kills that process group (server 1) and waits until it
  took effect, then reads; ``<file>.done`` records it. So the fault hits after LMCache's P2P lookup (which
  a frozen or dead server would fail by itself, before any read) and before the channel's read.
"""
import ctypes
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from procs import wait_dead, wait_stopped  # noqa: E402

from kvblocks.lmcache import __main__ as launcher  # noqa: E402
from kvblocks.lmcache import channel  # noqa: E402


def inject_fault() -> None:
    path = os.environ.get("KVBLOCKS_TEST_FAULT_FILE")
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        sig, pid = f.read().split()
    os.remove(path)
    os.killpg(int(pid), getattr(signal, "SIG" + sig))
    (wait_stopped if sig == "STOP" else wait_dead)(int(pid))
    with open(path + ".done", "w") as f:
        f.write(f"{sig} {time.time()}\n")


class TestClient(channel.KvblocksChannelClient):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._local = {}

    def submit_read(self, local_addresses, remote_addresses):
        inject_fault()
        tid = super().submit_read(local_addresses, remote_addresses)
        self._local[tid] = list(local_addresses)
        return tid

    def query_read_status(self, task_id):
        r = super().query_read_status(task_id)
        flag = os.environ.get("KVBLOCKS_TEST_CORRUPT_FLAG")
        local = self._local.pop(task_id, []) if r.finished else []
        if r.finished and (not flag or os.path.exists(flag)):
            base = self._ctx.cache.tensor_addrs[0]
            for a, ok in zip(local, r.succeeded_mask):
                if ok:
                    buf = np.ctypeslib.as_array((ctypes.c_uint8 * a.size).from_address(base + a.offset))
                    buf[::2] ^= 0x55  # every other byte: bf16 values become other values
        return r


channel.KvblocksChannelClient = TestClient

if __name__ == "__main__":
    launcher.main(sys.argv[1:])
