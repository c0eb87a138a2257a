# SPDX-License-Identifier: Apache-2.0
"""Run an unchanged CANN ``llm_datadist`` program on kvblocks.

    python -m kvblocks.compat SCRIPT [ARGS...]
    python -m kvblocks.compat -m MODULE [ARGS...]

Inside that process only, ``import llm_datadist`` and ``from llm_datadist.x import y`` resolve to
:mod:`kvblocks.llm_datadist`, and ``import hixl`` (``hixl.hixl``) to :mod:`kvblocks.hixl` (a meta-path
finder aliases the names). Nothing is installed, so a
real CANN ``llm_datadist`` elsewhere is never shadowed.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import runpy
import sys
import types
from typing import List, Optional, Sequence

ALIAS = "llm_datadist"
TARGET = "kvblocks.llm_datadist"
# Every CANN package name this process maps, and the kvblocks package it resolves to.
ALIASES = {ALIAS: TARGET, "hixl": "kvblocks.hixl"}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # already executed under its real name


class AliasFinder(importlib.abc.MetaPathFinder):
    """Maps ``llm_datadist[.x]`` to ``kvblocks.llm_datadist[.x]`` and ``hixl[.x]`` to ``kvblocks.hixl[.x]``."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        top = fullname.split(".", 1)[0]
        if top not in ALIASES:
            return None
        real = ALIASES[top] + fullname[len(top):]
        try:
            real_spec = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            return None
        if real_spec is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real),
                                              is_package=real_spec.submodule_search_locations is not None)


def install() -> AliasFinder:
    """Installs the alias finder in this process (idempotent)."""
    for f in sys.meta_path:
        if isinstance(f, AliasFinder):
            return f
    finder = AliasFinder()
    sys.meta_path.insert(0, finder)
    return finder


_USAGE = "usage: python -m kvblocks.compat SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip() if __doc__ else _USAGE)
        return 0 if args else 2
    install()
    if args[0] == "-m":
        if len(args) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = args
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
