# SPDX-License-Identifier: Apache-2.0
"""The Cython core compiles against a CANN-style build (``KVBLOCKS_WITH_CANN``, as setup.py does with
``KVBLOCKS_CANN_HOME``): the shim in ``kvblocks/ext_shim.h`` must offer every extension call the core
makes. It drifted once (SendNotify, GetNotifies and NotifyMessage were missing) without any test
noticing; this compile, syntax-only, is that test. No CANN install is needed: the headers under
``include/`` are CANN's API in our own text."""
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


def _cythonize(out):
    pytest.importorskip("Cython")
    src = os.path.join(ROOT, "kvblocks", "_lib.pyx")
    if not os.path.exists(src):
        pytest.skip("no kvblocks/_lib.pyx (not a source checkout)")
    subprocess.run([sys.executable, "-m", "cython", "--cplus", "-3", "-I", os.path.join(ROOT, "kvblocks"), src,
                    "-o", out], check=True, capture_output=True, text=True)


def _syntax_only(cpp, *defines):
    np = pytest.importorskip("numpy")
    cmd = [CXX, "-std=c++17", "-fsyntax-only", *defines, "-I", os.path.join(ROOT, "include"),
           "-I", os.path.join(ROOT, "kvblocks"), "-I", sysconfig.get_paths()["include"], "-I", np.get_include(), cpp]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_cython_core_compiles_against_a_cann_style_build(tmp_path):
    cpp = str(tmp_path / "_lib.cpp")
    _cythonize(cpp)
    r = _syntax_only(cpp, "-DKVBLOCKS_WITH_CANN=1")
    assert r.returncode == 0, r.stderr[-4000:]


def test_the_check_sees_a_shim_that_lacks_a_call(tmp_path):
    # Negative control: a shim without GetNotifies (the drift this file guards against) must fail.
    shim = open(os.path.join(ROOT, "kvblocks", "ext_shim.h")).read()
    start = shim.index("  static llm_datadist::Status GetNotifies(")
    end = shim.index("  }\n", start) + 4
    broken = tmp_path / "kvblocks"
    shutil.copytree(os.path.join(ROOT, "kvblocks"), broken,
                    ignore=shutil.ignore_patterns("*.so", "*.cpp", "__pycache__", "runtime", "bench"))
    (broken / "ext_shim.h").write_text(shim[:start] + shim[end:])
    cpp = str(tmp_path / "_lib.cpp")
    _cythonize(cpp)
    cmd = _syntax_only(cpp, "-DKVBLOCKS_WITH_CANN=1").args
    cmd[cmd.index(os.path.join(ROOT, "kvblocks"))] = str(broken)
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode != 0 and "GetNotifies" in r.stderr, r.stderr[-2000:]
