# SPDX-License-Identifier: Apache-2.0
"""``hixl.hixl``: the module CANN's package re-exports (here: the same objects as :mod:`kvblocks.hixl`)."""
from kvblocks.hixl import *  # noqa: F401,F403
from kvblocks.hixl import __all__  # noqa: F401
