# SPDX-License-Identifier: Apache-2.0
"""The UCX transport plugin of kvblocks. Nothing to import: kvblocks' runtime finds
libkvblocks_ucx.so beside this file and loads it on first need (kvblocks.Transport=ucx or auto)."""
import os

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkvblocks_ucx.so")
