# SPDX-License-Identifier: Apache-2.0
"""C++ embedding: compile CANN-style example programs against llm_datadist/llm_datadist.h with the
flags of ``python -m kvblocks --cflags --libs`` and run a prompt and a decoder process."""
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

import kvblocks
from procs import run_together

HERE = os.path.dirname(os.path.abspath(__file__))
CPP = os.path.join(HERE, "cpp")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def flags():
    """``python -m kvblocks --cflags --libs``, checked to name the headers and the library of the kvblocks
    this process imported (the one under test), so the programs are built and run against it."""
    out = subprocess.run([sys.executable, "-m", "kvblocks", "--cflags", "--libs"], capture_output=True, text=True,
                         check=True, env=_env(), timeout=60, cwd=tempfile.gettempdir()).stdout
    f = shlex.split(out)
    inc, lib = kvblocks.get_include(), kvblocks.get_library_dir()
    assert os.path.isfile(os.path.join(inc, "llm_datadist", "llm_datadist.h")), inc
    assert os.path.isfile(os.path.join(lib, "libllm_datadist.so")), lib
    assert f"-I{inc}" in f and "-lllm_datadist" in f and f"-L{lib}" in f and f"-Wl,-rpath,{lib}" in f, \
        f"flags {f} are not those of the imported kvblocks ({kvblocks.__file__})"
    assert not [x for x in f if x.startswith(("-I", "-L")) and x not in (f"-I{inc}", f"-L{lib}")], f
    return f


def test_paths_and_flags():
    flags()


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpp")
    built = {}
    f = flags()
    for name in ("prompt", "decoder"):
        exe = str(out / name)
        cmd = ["g++", "-O1", "-Wall", os.path.join(CPP, f"{name}.cpp"), "-o", exe, *f]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr
        built[name] = exe
    return built


def test_prompt_and_decoder_processes(programs, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # the rpath'd library only
    # If one program fails, run_together fails at once instead of waiting for the other's barrier timeout.
    outs = run_together([[programs[n], str(port), str(tmp_path)] for n in ("prompt", "decoder")], 90,
                        ["prompt", "decoder"], env=env)
    assert "pull verified" in outs[1] and "push verified" in outs[1] and "metrics verified" in outs[1]


@pytest.fixture(scope="module")
def hixl_programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpp_hixl")
    built = {}
    f = flags()
    assert os.path.isfile(os.path.join(kvblocks.get_include(), "hixl", "hixl.h"))
    for name in ("hixl_server", "hixl_client"):
        exe = str(out / name)
        cmd = ["g++", "-O1", "-Wall", "-std=c++17", os.path.join(CPP, f"{name}.cpp"), "-o", exe, *f]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr
        built[name] = exe
    return built


def test_hixl_server_and_client_processes(hixl_programs, tmp_path):
    """hixl/hixl.h programs (CANN's names and signatures) linked to the same runtime: a READ, a WRITE
    (async, with TransferArgs.user_data), a notification that follows it, and a refused range."""
    from ports import free_port
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    outs = run_together([[hixl_programs["hixl_server"], str(port), str(tmp_path)],
                         [hixl_programs["hixl_client"], str(port), str(tmp_path)]], 90,
                        ["hixl_server", "hixl_client"], env=env)
    assert "verified" in outs[0] and "verified" in outs[1]
