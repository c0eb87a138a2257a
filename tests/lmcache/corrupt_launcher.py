# SPDX-License-Identifier: Apache-2.0
"""The negative control of the end-to-end test: ``python -m kvblocks.lmcache`` with a kvblocks channel
whose reads deliver wrong bytes (each landed object XORed with 0x55 before it is reported finished).
Same arguments as the launcher. Corrupts only while the file named by ``KVBLOCKS_TEST_CORRUPT_FLAG`` exists
(unset: always), so one server serves the positive run and then the negative one. If the second engine's tokens do not change with it, the test proves
nothing about the channel."""
import ctypes
import os
import sys

import numpy as np

from kvblocks.lmcache import __main__ as launcher
from kvblocks.lmcache import channel


class CorruptingClient(channel.KvblocksChannelClient):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._local = {}

    def submit_read(self, local_addresses, remote_addresses):
        tid = super().submit_read(local_addresses, remote_addresses)
        self._local[tid] = list(local_addresses)
        return tid

    def query_read_status(self, task_id):
        r = super().query_read_status(task_id)
        flag = os.environ.get("KVBLOCKS_TEST_CORRUPT_FLAG")
        if r.finished and (not flag or os.path.exists(flag)):
            base = self._ctx.cache.tensor_addrs[0]
            for a, ok in zip(self._local.pop(task_id, []), r.succeeded_mask):
                if ok:
                    buf = np.ctypeslib.as_array((ctypes.c_uint8 * a.size).from_address(base + a.offset))
                    buf[::2] ^= 0x55  # every other byte: bf16 values become other values
        return r


channel.KvblocksChannelClient = CorruptingClient

if __name__ == "__main__":
    launcher.main(sys.argv[1:])
