# SPDX-License-Identifier: Apache-2.0
"""Build kvblocks: the C++ runtime as libllm_datadist.so, then the Cython core linked to it.

Environment switches:
  KVBLOCKS_CANN_HOME=/path/to/ascend-toolkit/latest  build the Cython core against a real CANN
      install (its include/llm_datadist/llm_datadist.h and lib64/libllm_datadist.so) instead of
      kvblocks' own runtime. kvblocks-only extensions then report LLM_FEATURE_NOT_ENABLED.
  KVBLOCKS_DEBUG=1            keep debug info (-g) in both libraries; by default they are built with
      -g0 and stripped at link, which makes the extension about 8x smaller.
  KVBLOCKS_CYTHON_DEBUG=1     bounds/wraparound checks and line tracing in the Cython core (implies
      KVBLOCKS_DEBUG=1).
  KVBLOCKS_CYTHON_ANNOTATE=1  write the Cython annotation HTML.
  KVBLOCKS_OPT="-O2"          optimisation flags for the C++ runtime (and the Cython core, unless
      KVBLOCKS_EXT_OPT is set).
  KVBLOCKS_EXT_OPT=...        optimisation flags for the Cython core alone. The sanitizer run of CI
      uses -O0 there: the 4 MB generated _lib.cpp took 168 s of CPU at -O1 with ASan and UBSan,
      20 s at -O0 (the runtime, where the data paths are, stays at -O1).
  KVBLOCKS_SANITIZE=address,undefined  build both libraries with these sanitizers (the list goes to
      -fsanitize=), frame pointers and debug info kept, unstripped; undefined behaviour aborts
      (-fno-sanitize-recover=undefined). Python then needs the ASan runtime loaded first:
      LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 pytest
      (CPython's own allocations would read as leaks). .ci/run does this.

A sanitizer build has its own build folder (build/san), so that it and the plain build (build/) stay
incremental side by side (CI builds both). A build whose flags differ from the previous one in the
same build folder recompiles everything.
"""
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIME_DIR = os.path.join("kvblocks", "runtime")
RUNTIME_LIB = "llm_datadist"
CANN_HOME = os.environ.get("KVBLOCKS_CANN_HOME")
DEBUG = os.environ.get("KVBLOCKS_CYTHON_DEBUG") == "1"
DEBUG_INFO = DEBUG or os.environ.get("KVBLOCKS_DEBUG") == "1"
SANITIZE = os.environ.get("KVBLOCKS_SANITIZE", "").strip()
if SANITIZE:
    if not all(SANITIZE.split(",")) or any(c.isspace() for c in SANITIZE):
        sys.exit(f"KVBLOCKS_SANITIZE={SANITIZE!r}: give a comma list such as address,undefined")
    DEBUG_INFO = True  # reports with file:line
SAN_CFLAGS = ["-fsanitize=" + SANITIZE, "-fno-omit-frame-pointer"] if SANITIZE else []
if "undefined" in SANITIZE.split(","):
    SAN_CFLAGS.append("-fno-sanitize-recover=undefined")  # undefined behaviour fails the test run
SAN_LDFLAGS = ["-fsanitize=" + SANITIZE] if SANITIZE else []
# Python's own CFLAGS usually carry -g; a later -g0 wins. -s drops the static symbol table at link
# (the exported API lives in the dynamic symbol table, which stays).
DEBUG_CFLAGS = (["-g"] if DEBUG_INFO else ["-g0"]) + SAN_CFLAGS
DEBUG_LDFLAGS = ([] if DEBUG_INFO else ["-s"]) + SAN_LDFLAGS
CXXFLAGS = ["-std=c++17", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
OPT = os.environ.get("KVBLOCKS_OPT", "-O2").split()
EXT_OPT = os.environ.get("KVBLOCKS_EXT_OPT", " ".join(OPT)).split()


class BuildPy(build_py):
    """Ships the public headers inside the package so get_include() works after install."""

    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "kvblocks", "include")
        if os.path.isdir(dst):
            shutil.rmtree(dst)
        shutil.copytree(os.path.join(HERE, "include"), dst)


class BuildExt(build_ext):
    """Builds libllm_datadist.so next to the extension, which finds it through $ORIGIN."""

    def run(self):
        # setuptools clears self.inplace inside run(); decide the library's home first.
        self._rt_dir = self.runtime_dir()
        # Objects and libraries left in build/ by a build with other flags (a sanitizer build, say)
        # look up to date to distutils: recompile and relink everything when the flags changed.
        stamp = os.path.join(self.build_temp, "kvblocks-flags")
        # Headers are tracked per object instead (stale_object; the extension's `depends`): a header
        # edit rebuilds only the objects that include it.
        flags = " ".join([CANN_HOME or "-", str(DEBUG)] + CXXFLAGS + OPT + EXT_OPT + DEBUG_CFLAGS + DEBUG_LDFLAGS)
        try:
            with open(stamp) as f:
                same = f.read() == flags
        except OSError:
            same = False
        if not same:
            self.force = True
        if not CANN_HOME:
            self.build_runtime()
        super().run()
        os.makedirs(self.build_temp, exist_ok=True)
        with open(stamp, "w") as f:
            f.write(flags)
        if self.inplace:
            src = os.path.join(HERE, "include")
            dst = os.path.join(HERE, "kvblocks", "include")
            if os.path.isdir(dst):
                shutil.rmtree(dst)
            shutil.copytree(src, dst)

    def runtime_dir(self):
        return os.path.join(HERE, "kvblocks") if self.inplace else os.path.join(self.build_lib, "kvblocks")

    def build_runtime(self):
        from setuptools._distutils.ccompiler import new_compiler
        from setuptools._distutils.sysconfig import customize_compiler

        cc = new_compiler(verbose=self.verbose, force=self.force)
        customize_compiler(cc)
        # Python's CFLAGS may carry C-only flags; the runtime is plain C++17.
        cc.compiler_so = [a for a in cc.compiler_so if a not in ("-Wstrict-prototypes",)]
        sources = runtime_sources()
        tmp = os.path.join(self.build_temp, "runtime")
        # Objects keep the sources' relative paths, so equal file names in two subfolders do not clash.
        for d in sorted({os.path.dirname(s) for s in sources}):
            os.makedirs(os.path.join(tmp, d), exist_ok=True)
        # -MMD: each object's .d lists the headers it included, for stale_object next time.
        args = CXXFLAGS + OPT + ["-fPIC", "-MMD"] + DEBUG_CFLAGS
        # "include" for the public headers, RUNTIME_DIR for the runtime's own ("wire/codec.h").
        include_dirs = ["include", RUNTIME_DIR]

        def compile_one(src):
            # distutils compiles every source it is given: skip an object whose inputs are unchanged.
            obj = cc.object_filenames([src], output_dir=tmp)[0]
            if not self.force and os.path.exists(obj) and not stale_object(obj):
                return obj
            return cc.compile([src], output_dir=tmp, include_dirs=include_dirs, extra_postargs=args)[0]

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            objects = list(pool.map(compile_one, sources))
        out_dir = self._rt_dir
        os.makedirs(out_dir, exist_ok=True)
        cc.link_shared_object(objects, os.path.join(out_dir, f"lib{RUNTIME_LIB}.so"),
                              libraries=["pthread"], target_lang="c++",
                              extra_postargs=["-Wl,-soname,lib%s.so" % RUNTIME_LIB] + DEBUG_LDFLAGS)

    def build_extension(self, ext):
        if not CANN_HOME:
            ext.library_dirs.append(self._rt_dir)
        super().build_extension(ext)


def stale_object(obj):
    """True when a file `obj` was built from (its .d, written by -MMD) is newer or gone; also without a .d."""
    try:
        with open(os.path.splitext(obj)[0] + ".d") as f:
            deps = f.read().replace("\\\n", " ").split(":", 1)[1].split()
        built = os.path.getmtime(obj)
        return any(os.path.getmtime(d) > built for d in deps)
    except (OSError, IndexError):
        return True


def public_headers():
    """The headers the Cython core includes from include/ (its `depends`: one changed rebuilds it)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(HERE, "include")):
        dirnames.sort()
        found += sorted(os.path.join(dirpath, f) for f in filenames if f.endswith(".h"))
    return found


def runtime_sources():
    """Every ``*.cc`` under kvblocks/runtime, subfolders included, as paths relative to the checkout."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(HERE, RUNTIME_DIR)):
        dirnames.sort()
        rel = os.path.relpath(dirpath, HERE)
        found += [os.path.join(rel, f) for f in filenames if f.endswith(".cc")]
    return sorted(found)


def cython_output_is_current(cpp=os.path.join("kvblocks", "_lib.cpp")):
    """True when ``cpp`` was generated by this Cython from the current .pyx/.pxi/.pxd files. It is then
    compiled as it is: Cython's own check regenerates it whenever Cython's bundled .pxd files are
    newer, which they always are in a fresh isolated build environment (pip's default), and the
    regenerated file recompiles the extension (about 20 CPU seconds) on every wheel build."""
    from Cython import __version__
    try:
        with open(cpp, encoding="utf-8") as f:
            first = f.readline().strip()
        built = os.path.getmtime(cpp)
    except OSError:
        return False
    sources = [os.path.join(d, f) for d in ("kvblocks", os.path.join("kvblocks", "includes"))
               for f in os.listdir(d) if f.endswith((".pyx", ".pxi", ".pxd"))]
    return first == f"/* Generated by Cython {__version__} */" and all(os.path.getmtime(s) <= built
                                                                         for s in sources)


def extensions():
    from Cython.Build import cythonize

    # CANN's headers first; kvblocks' own (include/kvblocks/: rules, ext_types) come from here.
    include_dirs = [os.path.join(CANN_HOME, "include"), "include"] if CANN_HOME else ["include"]
    library_dirs = [os.path.join(CANN_HOME, "lib64")] if CANN_HOME else []
    macros = [("KVBLOCKS_WITH_CANN", "1")] if CANN_HOME else []
    if DEBUG:
        macros.append(("CYTHON_TRACE_NOGIL", "1"))
    ext = Extension(
        "kvblocks._lib",
        ["kvblocks/_lib.pyx"],
        language="c++",
        include_dirs=include_dirs + ["kvblocks"],
        library_dirs=library_dirs,
        libraries=[RUNTIME_LIB],
        runtime_library_dirs=[] if CANN_HOME else ["$ORIGIN"],
        define_macros=macros,
        depends=public_headers(),
        extra_compile_args=CXXFLAGS + EXT_OPT + DEBUG_CFLAGS,
        extra_link_args=DEBUG_LDFLAGS,
    )
    directives = {
        "language_level": 3,
        "boundscheck": DEBUG,
        "wraparound": DEBUG,
        "initializedcheck": DEBUG,
        "nonecheck": False,
        "cdivision": True,
        "embedsignature": True,
    }
    if DEBUG:
        directives["linetrace"] = True
    annotate = os.environ.get("KVBLOCKS_CYTHON_ANNOTATE") == "1"
    # The directives the present _lib.cpp was generated with (a debug build's differ).
    stamp, wanted = os.path.join("build", "cython-directives"), repr(sorted(directives.items()))
    try:
        with open(stamp) as f:
            same = f.read() == wanted
    except OSError:
        same = False
    if same and not annotate and cython_output_is_current():
        ext.sources = [os.path.join("kvblocks", "_lib.cpp")]
        return [ext]
    exts = cythonize([ext], compiler_directives=directives, annotate=annotate)
    os.makedirs("build", exist_ok=True)
    with open(stamp, "w") as f:
        f.write(wanted)
    return exts

# The sanitizer build keeps its objects apart: switching between it and the plain build then rebuilds nothing.
OPTIONS = {"build": {"build_base": os.path.join("build", "san")}} if SANITIZE else {}
setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt, "build_py": BuildPy}, options=OPTIONS)
