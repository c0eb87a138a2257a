# SPDX-License-Identifier: Apache-2.0
"""CANN's C++ programs run unchanged (issue 31): CANN-style programs built as CANN builds its samples,
with ``-D_GLIBCXX_USE_CXX11_ABI=0`` and the flags of ``python -m kvblocks --cflags --libs``, using the
Ascend runtime stand-in (``acl/acl.h``) for device memory, run in real processes against the library.

* a prompt/decoder pair: aclrtMalloc'd caches filled with aclrtMemcpy, RegisterKvCache,
  LinkLlmClusters, PullKvBlocks, bytes checked;
* the switch-roles pair: after SetRole the DECODER pushes, with default options (CANN V2 roles);
* a hixl program using std::cerr with only ``hixl/hixl.h`` included;
* option maps built by an ABI=0 client are read correctly (good and bad values);
* kvblocks/ext.h calls that carry std::string do not link into an ABI=0 client."""
import os
import shutil
import subprocess

import pytest

from ports import free_port
from procs import run_together
from test_cpp_embed import CPP, flags

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

CANN_ABI = "-D_GLIBCXX_USE_CXX11_ABI=0"  # CANN's samples and libraries are built with it
PROGRAMS = ("cann_prompt", "cann_decoder", "hixl_cerr", "abi_options")


def _build(src, exe, *extra):
    cmd = ["g++", "-O1", "-Wall", *extra, os.path.join(CPP, src), "-o", exe, *flags()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120), cmd


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cann_cpp")
    built = {}
    for name in PROGRAMS:
        exe = str(out / name)
        r, cmd = _build(f"{name}.cpp", exe, CANN_ABI)
        assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr
        built[name] = exe
    return built


def _env():
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # the rpath'd library only


@pytest.mark.parametrize("mode", ["pull", "switch"])
def test_prompt_decoder_pair(programs, tmp_path, mode):
    port = free_port()
    outs = run_together([[programs[n], str(port), str(tmp_path), mode] for n in ("cann_prompt", "cann_decoder")],
                        60, ["cann_prompt", "cann_decoder"], env=_env())
    assert "pull verified" in outs[1]
    if mode == "switch":
        assert "pushed as DECODER" in outs[0] and "push from a DECODER verified" in outs[1]


def test_hixl_program_with_only_hixl_h(programs):
    r = subprocess.run([programs["hixl_cerr"], str(free_port())], capture_output=True, text=True, timeout=30,
                       env=_env())
    assert r.returncode == 0 and "verified" in r.stderr, r.stdout + r.stderr


def test_abi0_option_maps(programs):
    r = subprocess.run([programs["abi_options"], str(free_port())], capture_output=True, text=True, timeout=30,
                       env=_env())
    assert r.returncode == 0 and "all options read correctly" in r.stdout, r.stdout + r.stderr


def test_ext_string_calls_refuse_to_link_abi0(tmp_path):
    r, cmd = _build("ext_abi0.cpp", str(tmp_path / "abi1"))
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr
    r, _ = _build("ext_abi0.cpp", str(tmp_path / "abi0"), CANN_ABI)
    assert r.returncode != 0
    missing = {name for name in ("GetNotifies", "SendNotify", "LinkPath", "HasLinks")
               if f"kvblocks::ImplAccess::{name}" in r.stderr}
    assert missing == {"GetNotifies", "SendNotify", "LinkPath"}, r.stderr
