# SPDX-License-Identifier: Apache-2.0
"""CPU share probe for .ci/lib.sh: every PERIOD s, spins for 0.1 s and prints "epoch share", where share
is the CPU time it got over the wall time (1.0: a core was free; 0.3: a runnable thread of this
priority got 30 % of a core). The time table shows its mean per part: how shared the machine was. Costs
about 2 % of one core."""
import sys
import time

PERIOD = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
while True:
    w0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - w0 < 0.1:
        pass
    share = (time.process_time() - c0) / (time.monotonic() - w0)
    print(f"{int(time.time())} {min(share, 1.0):.3f}", flush=True)
    time.sleep(PERIOD)
