# SPDX-License-Identifier: Apache-2.0
"""A connect-flood attacker process: python flood.py PORT SOCKETS SECONDS RATE (see hostile.flood)."""
import sys

from hostile import flood

if __name__ == "__main__":
    print(flood(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])), flush=True)
