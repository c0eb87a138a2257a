# SPDX-License-Identifier: Apache-2.0
"""Build libkvblocks_ucx.so, the plugin kvblocks' runtime dlopen()s for kvblocks.Transport=ucx.

The plugin links libucp. By default it is built against the libucx-cu12 wheel (a build
requirement) and finds that wheel's libraries at run time through its rpath. Environment:
  KVBLOCKS_UCX_HOME=/usr   build against another UCX (include/ucp/api/ucp.h, lib/libucp.so under it),
      e.g. a system UCX with verbs for RDMA hosts; the plugin's rpath then points there.
  KVBLOCKS_DEBUG=1         keep debug info.
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# The C interface shared with the runtime lives beside the runtime's other transports.
ABI_DIR = os.path.join(HERE, "..", "kvblocks", "runtime", "transport")


def ucx_prefix():
    """(include dir, lib dir, rpath) of the UCX to build against."""
    home = os.environ.get("KVBLOCKS_UCX_HOME")
    if home:
        lib = os.path.join(home, "lib")
        for cand in (os.path.join(home, "lib", "x86_64-linux-gnu"), os.path.join(home, "lib64")):
            if os.path.exists(os.path.join(cand, "libucp.so")):
                lib = cand
        return os.path.join(home, "include"), lib, lib
    try:
        import libucx
    except ImportError:
        sys.exit("kvblocks-ucx: no UCX found: install libucx-cu12 or set KVBLOCKS_UCX_HOME")
    root = os.path.dirname(libucx.__file__)
    # site-packages/kvblocks_ucx/ -> site-packages/libucx/lib
    return os.path.join(root, "include"), os.path.join(root, "lib"), "$ORIGIN/../libucx/lib"


class BuildPlugin(build_ext):
    def build_extension(self, ext):
        inc, lib, rpath = ucx_prefix()
        ext.include_dirs += [inc, ABI_DIR]
        ext.library_dirs.append(lib)
        ext.runtime_library_dirs.append(rpath)
        super().build_extension(ext)

    def get_ext_filename(self, ext_name):
        return os.path.join(*ext_name.split(".")) + ".so"  # a plain library name, not a Python module


DEBUG = os.environ.get("KVBLOCKS_DEBUG") == "1"
plugin = Extension(
    "kvblocks_ucx.libkvblocks_ucx",
    ["src/ucx_plugin.cc"],
    language="c++",
    libraries=["ucp", "ucs"],
    extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wall"] + (["-g"] if DEBUG else ["-g0"]),
    extra_link_args=[] if DEBUG else ["-s"],
)

setup(ext_modules=[plugin], cmdclass={"build_ext": BuildPlugin})
