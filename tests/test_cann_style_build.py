# SPDX-License-Identifier: Apache-2.0
"""The Cython core compiles against a CANN-style build (``KVBLOCKS_WITH_CANN``, as setup.py does with
``KVBLOCKS_CANN_HOME``). That build has no kvblocks runtime: ``kvblocks/ext_shim.h`` includes the runtime's
own headers (ext.h and what it includes: the same structs, classes and ImplAccess declarations) and only
defines their functions, inline. The shim drifted once (SendNotify, GetNotifies and NotifyMessage were
missing) without any test noticing; these compiles are that test: syntax-only, then to an object that
must need no kvblocks symbol from outside (a call the shim does not define would fail only when a CANN
build is imported). No CANN install is needed: the headers under ``include/`` are CANN's API in our own
text. Each negative control breaks one header in a copy and checks that the compile names the break."""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = os.environ.get("CXX", "g++")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")]


@pytest.fixture(scope="module")
def core_cpp(tmp_path_factory):
    """The Cython core as C++, generated once for every compile below."""
    pytest.importorskip("Cython")
    src = os.path.join(ROOT, "kvblocks", "_lib.pyx")
    if not os.path.exists(src):
        pytest.skip("no kvblocks/_lib.pyx (not a source checkout)")
    out = str(tmp_path_factory.mktemp("cann") / "_lib.cpp")
    subprocess.run([sys.executable, "-m", "cython", "--cplus", "-3", "-I", os.path.join(ROOT, "kvblocks"), src,
                    "-o", out], check=True, capture_output=True, text=True)
    return out


def _compile(cpp, *mode, include=os.path.join(ROOT, "include"), shim_dir=os.path.join(ROOT, "kvblocks")):
    np = pytest.importorskip("numpy")
    cmd = [CXX, "-std=c++17", "-DKVBLOCKS_WITH_CANN=1", *mode, "-I", include, "-I", shim_dir,
           "-I", sysconfig.get_paths()["include"], "-I", np.get_include(), cpp]
    return subprocess.run(cmd, capture_output=True, text=True)


def _undefined_kvblocks_symbols(cpp, tmp_path, **dirs):
    """kvblocks functions the compiled core needs from outside (a CANN build has none to give)."""
    if shutil.which("nm") is None:
        pytest.skip("no nm")
    obj = str(tmp_path / "_lib.o")
    r = _compile(cpp, "-O0", "-fPIC", "-c", "-o", obj, **dirs)
    assert r.returncode == 0, r.stderr[-4000:]
    nm = subprocess.run(["nm", "-C", "--undefined-only", obj], capture_output=True, text=True, check=True)
    return [line.split(None, 1)[-1] for line in nm.stdout.splitlines() if "kvblocks::" in line]


def _broken_copy(tmp_path, rel, start, end="\n"):
    """include/ and the shim's folder in tmp_path, with ``rel`` missing the text from ``start`` to ``end``."""
    include, shim_dir = tmp_path / "include", tmp_path / "shim"
    shutil.copytree(os.path.join(ROOT, "include"), include)
    os.makedirs(shim_dir)
    for f in os.listdir(os.path.join(ROOT, "kvblocks")):
        if f.endswith(".h"):
            shutil.copy(os.path.join(ROOT, "kvblocks", f), shim_dir / f)
    path = tmp_path / rel.replace("kvblocks/ext_shim.h", "shim/ext_shim.h")
    text = path.read_text()
    a = text.index(start)
    b = text.index(end, a) + len(end)
    path.write_text(text[:a] + text[b:])
    return {"include": str(include), "shim_dir": str(shim_dir)}


def test_cython_core_compiles_against_a_cann_style_build(core_cpp):
    r = _compile(core_cpp, "-fsyntax-only")
    assert r.returncode == 0, r.stderr[-4000:]


def test_the_shim_defines_every_kvblocks_call_the_core_makes(core_cpp, tmp_path):
    missing = _undefined_kvblocks_symbols(core_cpp, tmp_path)
    assert not missing, "the CANN-style build would need: " + "; ".join(missing)


def test_the_check_sees_a_shim_that_lacks_a_definition(core_cpp, tmp_path):
    # Negative control: the shim without its GetNotifies (the drift this file guards against) still
    # compiles, but the core then needs kvblocks::ImplAccess::GetNotifies from a library CANN lacks.
    dirs = _broken_copy(tmp_path, "kvblocks/ext_shim.h", "inline llm_datadist::Status ImplAccess::GetNotifies(",
                        "\n}\n")
    missing = _undefined_kvblocks_symbols(core_cpp, tmp_path, **dirs)
    assert any("ImplAccess::GetNotifies" in s for s in missing), missing


def test_the_check_sees_a_call_missing_from_the_headers(core_cpp, tmp_path):
    # Negative control: ext.h without SendNotify breaks the CANN-style build too (the shim cannot define
    # what the runtime's header does not declare, and the core calls it).
    dirs = _broken_copy(tmp_path, "include/kvblocks/ext.h", "  static llm_datadist::Status SendNotify(", ";\n")
    r = _compile(core_cpp, "-fsyntax-only", **dirs)
    assert r.returncode != 0 and "SendNotify" in r.stderr, r.stderr[-2000:]


def test_the_check_sees_a_struct_missing_from_the_headers(core_cpp, tmp_path):
    # Negative control: NotifyMessage gone from ext_types.h is an error in the CANN-style build.
    dirs = _broken_copy(tmp_path, "include/kvblocks/ext_types.h", "struct KVBLOCKS_STD_STRING_ABI NotifyMessage {",
                        "};\n")
    r = _compile(core_cpp, "-fsyntax-only", **dirs)
    assert r.returncode != 0 and "NotifyMessage" in r.stderr, r.stderr[-2000:]
