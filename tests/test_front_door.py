# SPDX-License-Identifier: Apache-2.0
"""What a new user meets first: the ``kvblocks`` command, importing from the checkout, the installed files."""
import glob
import importlib.machinery
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

import kvblocks as kb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(os.path.abspath(kb.__file__))
FROM_SOURCE = os.path.exists(os.path.join(PKG, "_lib.pyx"))  # this suite runs against an in-place build
RST = re.compile(r"``|:(func|class|meth|mod|attr|data):`|::$", re.M)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(extra)
    return env


BENCH_SRC = os.path.join(ROOT, "bench")  # kvblocks-bench's source (kvblocks_bench), in a checkout


def cli(*args, tmp_path, bench=True):
    """``python -m kvblocks ARGS`` outside the checkout, importing the kvblocks this suite tests (and,
    with ``bench``, the checkout's kvblocks-bench, as after ``pip install ./bench``)."""
    path = [os.path.dirname(PKG)] + ([BENCH_SRC] if bench and os.path.isdir(BENCH_SRC) else [])
    env = clean_env(PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, "-m", "kvblocks", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


# --- importing the source tree ---------------------------------------------------------------------------

def _built_in_place():
    src = os.path.join(ROOT, "kvblocks")
    return any(os.path.exists(os.path.join(src, "_lib" + s)) for s in importlib.machinery.EXTENSION_SUFFIXES)


@pytest.mark.parametrize("argv", [["-c", "import kvblocks"], ["-m", "kvblocks", "--version"],
                                  ["-m", "kvblocks", "demo"]])
def test_import_from_source_tree_says_what_to_do(argv):
    if not os.path.exists(os.path.join(ROOT, "kvblocks", "_lib.pyx")):
        pytest.skip("not a source checkout")
    if _built_in_place():
        pytest.skip("the checkout is built in place, so importing it works")
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, env=clean_env(),
                       timeout=60)
    assert r.returncode == 1, r.stderr
    assert "ImportError: you are importing kvblocks from its source tree" in r.stderr, r.stderr
    assert "pip install ." in r.stderr and "build_ext --inplace" in r.stderr, r.stderr
    assert "ModuleNotFoundError" not in r.stderr, r.stderr


# --- the command line ------------------------------------------------------------------------------------

def test_version(tmp_path):
    r = cli("--version", tmp_path=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"kvblocks {kb.__version__}", r


def test_console_script_version(tmp_path):
    exe = shutil.which("kvblocks", path=os.path.dirname(sys.executable))
    if exe is None or FROM_SOURCE:
        pytest.skip("the suite runs against an in-place build, or no kvblocks script is installed")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"kvblocks {kb.__version__}", r


@pytest.mark.parametrize("args", [[], ["--help"], ["demo", "--help"]])
def test_help_is_plain_text(args, tmp_path):
    r = cli(*args, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m kvblocks"), r.stdout
    assert not RST.search(r.stdout), r.stdout


def test_help_lists_the_commands(tmp_path):
    out = cli("--help", tmp_path=tmp_path).stdout
    for word in ("demo", "bench", "--cflags", "--libs", "--version"):
        assert word in out


@pytest.mark.parametrize("args", [["--cflags", "bogus"], ["--bogus"], ["nope"], ["--libs", "demo"],
                                  ["demo", "--bogus"], ["demo", "extra"], ["bench", "--bogus"]])
def test_usage_errors_exit_2(args, tmp_path):
    r = cli(*args, tmp_path=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "usage:" in r.stderr and "error:" in r.stderr, r.stderr
    assert r.stdout == ""


def test_flags_in_the_order_given(tmp_path):
    r = cli("--libs", "--cflags", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    libs, cflags = r.stdout.split(" -I", 1)
    assert libs.startswith(f"-L{kb.get_library_dir()} ") and "-lllm_datadist" in libs
    assert cflags.startswith(kb.get_include())


def test_bench_gets_its_arguments(tmp_path):
    r = cli("bench", "--help", tmp_path=tmp_path)
    assert r.returncode == 0 and "usage:" in r.stdout and "--case" in r.stdout, r
    assert not RST.search(r.stdout), r.stdout


def test_bench_without_its_package_says_how_to_get_it(tmp_path):
    """Contract: the bench is not in the kvblocks wheel; without kvblocks-bench, ``kvblocks bench``
    says where it comes from (exit 2), and importing kvblocks never needed it."""
    r = cli("bench", "--help", tmp_path=tmp_path, bench=False)
    assert r.returncode == 2 and "pip install ./bench" in r.stderr and "kvblocks-bench" in r.stderr, r
    assert not os.path.isdir(os.path.join(PKG, "bench")), "the bench is back inside the kvblocks package"


def test_public_functions_say_what_they_raise():
    from kvblocks import __main__ as cli_mod, demo

    for f in (kb.get_include, kb.get_library_dir, cli_mod.main, demo.main):
        assert f.__doc__ and "Raises" in f.__doc__, f"{f.__module__}.{f.__qualname__}"


# --- what gets installed ---------------------------------------------------------------------------------

installed_only = pytest.mark.skipif(FROM_SOURCE, reason="checks an installed kvblocks, not an in-place build")


def _section_names(path):
    """Section names of a 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, path
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    str_off, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    names = []
    for i in range(shnum):
        name, = struct.unpack_from("<I", data, shoff + i * shentsize)
        names.append(data[str_off + name:data.index(b"\0", str_off + name)].decode())
    return names


@installed_only
@pytest.mark.skipif(sys.platform != "linux" or struct.calcsize("P") != 8, reason="64-bit Linux ELF check")
def test_installed_libraries_carry_no_debug_info():
    if os.environ.get("KVBLOCKS_DEBUG") == "1" or os.environ.get("KVBLOCKS_CYTHON_DEBUG") == "1":
        pytest.skip("a debug build was asked for")
    if os.environ.get("KVBLOCKS_SANITIZE"):
        pytest.skip("a sanitizer build (which keeps debug info) was asked for")
    libs = glob.glob(os.path.join(PKG, "_lib*.so")) + [os.path.join(PKG, "libllm_datadist.so")]
    assert len(libs) == 2, libs
    for lib in libs:
        debug = [n for n in _section_names(lib) if n.startswith(".debug")]
        assert not debug, f"{os.path.basename(lib)} has {debug}"


@installed_only
def test_only_public_headers_are_installed():
    headers = sorted(os.path.relpath(p, PKG) for p in glob.glob(os.path.join(PKG, "**", "*.h"), recursive=True))
    assert headers, "no headers installed"
    named = set()  # the Cython-level headers (ext_shim.h, log_queue.h): a downstream cimport needs them
    for pxd in glob.glob(os.path.join(PKG, "**", "*.pxd"), recursive=True):
        with open(pxd, encoding="utf-8") as f:
            named |= set(re.findall(r'^cdef extern from "([^"/]+\.h)"', f.read(), re.M))
    private = [h for h in headers if not h.startswith("include" + os.sep) and h not in named]
    assert not private, private
    assert not os.path.exists(os.path.join(PKG, "runtime"))


@installed_only
def test_headers_named_by_the_pxd_files_are_installed():
    """A downstream ``cimport kvblocks._lib`` compiles with ``-I get_include() -I <package dir>``."""
    pxds = glob.glob(os.path.join(PKG, "**", "*.pxd"), recursive=True)
    wanted = set()
    for pxd in pxds:
        with open(pxd, encoding="utf-8") as f:
            wanted |= set(re.findall(r'^cdef extern from "([^"]+\.h)"', f.read(), re.M))
    assert wanted
    dirs = [kb.get_include(), PKG]
    missing = [h for h in sorted(wanted) if not any(os.path.exists(os.path.join(d, h)) for d in dirs)]
    assert not missing, missing


@installed_only
def test_version_matches_the_distribution():
    import importlib.metadata

    assert importlib.metadata.version("kvblocks") == kb.__version__
