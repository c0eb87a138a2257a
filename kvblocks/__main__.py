# SPDX-License-Identifier: Apache-2.0
"""``python -m kvblocks``: demo, benchmarks, and build flags for C++ users.

  python -m kvblocks demo          a Prompt and a Decoder process move real blocks, verified
  python -m kvblocks bench ...     the benchmark matrix (see ``python -m kvblocks bench --help``)
  python -m kvblocks --cflags      compiler flags for code using llm_datadist/llm_datadist.h
  python -m kvblocks --libs        linker flags for libllm_datadist.so
"""
import sys


def _flags(kind: str) -> str:
    import kvblocks

    if kind == "--cflags":
        return f"-I{kvblocks.get_include()} -std=c++17"
    lib = kvblocks.get_library_dir()
    return f"-L{lib} -Wl,-rpath,{lib} -lllm_datadist -lpthread"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv[0] in ("--cflags", "--libs"):
        print(" ".join(_flags(a) for a in argv if a in ("--cflags", "--libs")))
        return 0
    if argv[0] == "demo":
        from kvblocks import demo

        return demo.main(argv[1:])
    if argv[0] == "bench":
        from kvblocks import benchmark

        return benchmark.main(argv[1:])
    print(f"unknown command {argv[0]!r}\n\n{__doc__.strip()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
