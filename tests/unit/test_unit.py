# SPDX-License-Identifier: Apache-2.0
"""The runtime's C++ unit tests (tests/unit/*.cpp): wire messages, plans, the cache table, backend
selection. One binary built from the runtime's own sources (cached under build/unit/ by a hash of its
inputs), one pytest item
per C++ case. With KVBLOCKS_SANITIZE set (the sanitizer CI run) it is built with those sanitizers."""
import glob
import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUNTIME = os.path.join(ROOT, "kvblocks", "runtime")
# The runtime files under test: each is compiled alone, so a unit keeps its dependencies few.
UNDER_TEST = ["wire/messages.cc", "wire/table.cc", "plan/plan.cc", "transport/plan.cc", "plan/layout.cc", "transport/checked.cc",
              "security/crc32c.cc", "net/socket.cc", "net/tls.cc", "security/hmac.cc", "common/util.cc",
              "common/error.cc", "transport/path.cc", "transport/ucx/ucx_info.cc"]
CXX = os.environ.get("CXX", "g++")

pytestmark = [pytest.mark.skipif(shutil.which(CXX) is None, reason=f"{CXX} is not installed"),
              pytest.mark.skipif(not os.path.isdir(RUNTIME), reason="needs the runtime sources (a source checkout)")]


def _command(exe):
    flags = ["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror"]
    sanitize = os.environ.get("KVBLOCKS_SANITIZE")
    if sanitize:
        flags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
    sources = sorted(glob.glob(os.path.join(HERE, "*.cpp"))) + [os.path.join(RUNTIME, f) for f in UNDER_TEST]
    return [CXX, *flags, f"-I{RUNTIME}", f"-I{os.path.join(ROOT, 'include')}", *sources, "-o", exe]


def _inputs_hash(cmd):
    h = hashlib.sha256(" ".join(cmd).encode())
    files = cmd + sorted(glob.glob(os.path.join(HERE, "*.h")))
    headers = sorted(glob.glob(os.path.join(RUNTIME, "**", "*.h"), recursive=True) +
                     glob.glob(os.path.join(ROOT, "include", "**", "*.h"), recursive=True))
    for path in [f for f in files if os.path.isfile(f)] + headers:
        with open(path, "rb") as f:
            h.update(path.encode() + f.read())
    return h.hexdigest()[:16]


def _run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr
    return r


def _build():
    """The unit binary, built once per set of inputs (later runs reuse it): one object per source,
    compiled in parallel on every core (one compiler run for all took 100 s on a loaded 2-core host),
    then linked."""
    probe = _command("EXE")
    exe = os.path.join(ROOT, "build", "unit", f"unit-{_inputs_hash(probe)}")
    if not os.path.exists(exe):
        cxx, flags, sources = probe[0], [a for a in probe[1:] if a.startswith("-") and a != "-o"], \
            [a for a in probe[1:] if not a.startswith("-") and a != "EXE"]
        objdir = exe + ".obj"
        os.makedirs(objdir, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the compiler needs no ASan
        objects = [os.path.join(objdir, f"{i}-{os.path.basename(src)}.o") for i, src in enumerate(sources)]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda so: _run([cxx, *flags, "-c", so[0], "-o", so[1]], env), zip(sources, objects)))
        link_flags = [f for f in flags if not f.startswith("-I") and not f.startswith("-W")]
        _run([cxx, *link_flags, *objects, "-o", exe + ".tmp"], env)
        os.replace(exe + ".tmp", exe)
        shutil.rmtree(objdir, ignore_errors=True)
    return exe


def _cases():
    """The case names, read from the sources (collection must not compile anything)."""
    names = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.cpp"))):
        with open(path) as f:
            names += [line.split("(", 1)[1].split(")", 1)[0] for line in f if line.startswith("TEST(")]
    return names


@pytest.fixture(scope="session")
def unit_exe():
    exe = _build()
    listed = subprocess.run([exe, "--list"], capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert sorted(listed) == sorted(_cases()), "the binary's cases differ from the TEST( lines in the sources"
    return exe


@pytest.mark.parametrize("case", _cases())
def test_unit(unit_exe, case):
    r = subprocess.run([unit_exe, case], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"ok {case}", r.stdout + r.stderr
