# SPDX-License-Identifier: Apache-2.0
"""The benchmark package behind ``python -m kvblocks bench`` and ``pytest bench/``.

  common    sizes, repetition policy, the Case record    markers   block markers, id lists
  harness   peer process, cache pairs (Pair, Harness)    baselines numpy / raw syscall / socket rows
  cases     the case matrix and its selection            timing    interleaved measurement, statistics
  engines   NIXL and Mooncake drivers                    engine_side  an engine as an interleaved side
  runner    runs the cases                               targets   the performance targets
  report    tables, JSON, Markdown, plot, machine info   cli       argument parsing, main()

Nothing here imports numpy, tabulate, tqdm or matplotlib until it is used.
"""
from .cases import all_cases, cases_for, select
from .cli import main
from .common import REPS, SIZES, TRANSPORT, Case
from .harness import Harness, Pair
from .runner import run_cases
from .timing import measure, measure_interleaved, summarize

__all__ = ["REPS", "SIZES", "TRANSPORT", "Case", "Harness", "Pair", "all_cases", "cases_for", "main",
           "measure", "measure_interleaved", "run_cases", "select", "summarize"]
