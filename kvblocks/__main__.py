# SPDX-License-Identifier: Apache-2.0
"""The ``kvblocks`` command (also ``python -m kvblocks``): demo, benchmarks, build flags for C++ users."""
import argparse
import os
import sys

_DESCRIPTION = "KV-cache block transfer for disaggregated LLM serving (CANN LLM-DataDist API)."
_EPILOG = """\
examples:
  kvblocks demo                      a Prompt and a Decoder process move real blocks, verified
  kvblocks demo --listen IP:PORT     the Prompt side for another host ...
  kvblocks demo --connect IP:PORT    ... and the Decoder side there
  kvblocks ping IP:PORT              path, round trip and bandwidth of a link to a demo listener
  kvblocks bench --case shm          the benchmark matrix (kvblocks bench --help)
  g++ app.cpp $(kvblocks --cflags --libs)

'python -m kvblocks' is the same command; run it outside the source checkout, whose ./kvblocks
folder would hide the installed package."""

# Commands whose arguments belong to them: everything after the name is passed on unparsed.
_COMMANDS = {
    "demo": "run the two-process demo (kvblocks demo --help)",
    "ping": "measure a link to a 'kvblocks demo --listen' peer (kvblocks ping --help)",
    "bench": "run the benchmark matrix (kvblocks bench --help; needs kvblocks-bench: pip install ./bench)",
}


def _prog() -> str:
    """How the user invoked us, for usage lines: ``python -m kvblocks`` or ``kvblocks``. Raises nothing."""
    if os.path.basename(sys.argv[0] if sys.argv else "") == "__main__.py":
        return "python -m kvblocks"
    return "kvblocks"


def _flags(kind: str) -> str:
    """Compiler (``cflags``) or linker (``libs``) flags for code using the C++ API. Raises nothing."""
    import kvblocks

    if kind == "cflags":
        return f"-I{kvblocks.get_include()} -std=c++17"
    lib = kvblocks.get_library_dir()
    return f"-L{lib} -Wl,-rpath,{lib} -lllm_datadist -lpthread"


def _parser(prog: str) -> argparse.ArgumentParser:
    """The top-level parser: options, plus the commands listed for --help. Raises nothing."""
    import kvblocks

    ap = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION, epilog=_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"kvblocks {kvblocks.__version__}")
    ap.add_argument("--cflags", dest="flags", action="append_const", const="cflags",
                    help="print compiler flags for code including llm_datadist/llm_datadist.h")
    ap.add_argument("--libs", dest="flags", action="append_const", const="libs",
                    help="print linker flags for libllm_datadist.so")
    sub = ap.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, text in _COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return ap


def _ping(argv, prog: str) -> int:
    """``kvblocks ping IP:PORT``: link to a demo listener, print the path, round trip and bandwidth.

    Returns 1 with a one-line error when the link or a pull fails or the listener does not answer.

    Raises:
        SystemExit: status 2 with a usage message for a bad argument or address.
    """
    import kvblocks
    from kvblocks import remote

    ap = argparse.ArgumentParser(prog=prog, description="Link to a 'kvblocks demo --listen' peer and print the "
                                 "data path chosen, the round trip of a 4 KiB pull and the bandwidth of a 32 MiB "
                                 "pull (medians). Set KVBLOCKS_AUTH_TOKEN as on the listener.")
    ap.add_argument("addr", metavar="IP:PORT", help="the listener's address")
    ap.add_argument("--count", type=int, default=10, metavar="N", help="pulls of each size (default 10)")
    ap.add_argument("--transport", choices=["auto", "shm", "tcp"], default="auto", help="force a data path")
    args = ap.parse_args(argv)
    if args.count < 1:
        ap.error("--count must be at least 1")
    try:
        remote.parse_addr(args.addr, listening=False)
    except ValueError as e:
        ap.error(str(e))
    try:
        return remote.run_ping(args.addr, count=args.count, transport=args.transport)
    except (kvblocks.LLMException, TimeoutError) as e:
        print(f"{prog}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


_NO_BENCH = """\
kvblocks bench: the benchmark is a separate package, kvblocks-bench, built from the bench/ folder of
the kvblocks source repository (it is not part of the kvblocks wheel). From a checkout:

    pip install ./bench          # or: pip install . ./bench

then run 'kvblocks bench --help'."""


def _bench(argv) -> int:
    """``kvblocks bench``: the benchmark matrix from the kvblocks-bench package; 2 with how to get it
    when it is not installed. Raises whatever the bench raises (SystemExit for its usage errors)."""
    try:
        import kvblocks_bench
    except ImportError as e:
        if getattr(e, "name", None) != "kvblocks_bench":
            raise  # the bench is there but broken: show why
        print(_NO_BENCH, file=sys.stderr)
        return 2
    return kvblocks_bench.main(argv)


def main(argv=None) -> int:
    """Run the ``kvblocks`` command line; returns the exit status.

    ``demo``, ``ping`` and ``bench`` receive the rest of the arguments unparsed; ``--cflags``/``--libs`` print
    their flags in the order given; no arguments prints the help.

    Raises:
        SystemExit: status 0 after ``--help``/``--version``; status 2 with a usage message for an unknown
            option or command, an extra argument (``--cflags bogus``), or options mixed with a command
            (argparse's error convention).
        ImportError: when kvblocks itself cannot be imported (e.g. the unbuilt source tree is first on
            ``sys.path``; the message says what to do).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = _prog()
    if argv and argv[0] == "demo":
        from kvblocks import demo

        return demo.main(argv[1:], prog=f"{prog} demo")
    if argv and argv[0] == "ping":
        return _ping(argv[1:], prog=f"{prog} ping")
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    ap = _parser(prog)
    args = ap.parse_args(argv)
    if args.command is not None:  # e.g. "--cflags demo": commands take no top-level options
        ap.error(f"{args.command!r} must come first; its options go after it")
    if not args.flags:
        ap.print_help()
        return 0
    print(" ".join(_flags(kind) for kind in args.flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
