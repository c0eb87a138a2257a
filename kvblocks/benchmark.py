# SPDX-License-Identifier: Apache-2.0
"""Old name of :mod:`kvblocks.bench`, kept so ``python -m kvblocks bench`` keeps working."""
from kvblocks.bench import main

__all__ = ["main"]
