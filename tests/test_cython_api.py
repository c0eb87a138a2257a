# SPDX-License-Identifier: Apache-2.0
"""Cython embedding: a throwaway downstream extension cimports kvblocks and moves data from its
own ``with nogil:`` block through ``pull_blocks_nogil`` / ``push_blocks_nogil`` and the asynchronous
``pull_blocks_async_nogil`` / ``push_blocks_async_nogil`` / ``wait_transfer_nogil``, and the
layer-wise ``open_layer_push_nogil`` / ``layer_ready_nogil`` / ``finish_layer_push_nogil``."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import kvblocks

pytest.importorskip("Cython")
pytest.importorskip("setuptools")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no C++ compiler")

PKG_DIR = os.path.dirname(os.path.abspath(kvblocks.__file__))
PKG_ROOT = os.path.dirname(PKG_DIR)

PYX = '''
# distutils: language = c++
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libcpp.vector cimport vector
from kvblocks._lib cimport LlmDataDist, pull_blocks_nogil, push_blocks_nogil
from kvblocks._lib cimport pull_blocks_async_nogil, push_blocks_async_nogil, wait_transfer_nogil
from kvblocks._lib cimport open_layer_push_nogil, layer_ready_nogil, finish_layer_push_nogil
from kvblocks.includes.libkvblocks cimport CLayerPush, CLlmDataDist, CTransferHandle, Status


def pull(LlmDataDist dd, uint64_t cluster, int64_t src_id, int64_t dst_id, src, dst):
    cdef vector[uint64_t] s = src
    cdef vector[uint64_t] d = dst
    cdef CLlmDataDist* p = dd.native()
    cdef Status st
    with nogil:
        st = pull_blocks_nogil(p, cluster, src_id, dst_id, s.data(), d.data(), s.size(), -1, -1, -1, -1, 2)
    return st


def push(LlmDataDist dd, int64_t src_id, uint32_t num_tensors, uint64_t cluster, int64_t dst_id, src, dst,
         int first, int last, int tnpl):
    cdef vector[uint64_t] s = src
    cdef vector[uint64_t] d = dst
    cdef CLlmDataDist* p = dd.native()
    cdef Status st
    with nogil:
        st = push_blocks_nogil(p, src_id, num_tensors, cluster, dst_id, s.data(), d.data(), s.size(),
                               first, last, first, last, <unsigned char>tnpl)
    return st


def pull_async(LlmDataDist dd, uint64_t cluster, int64_t src_id, int64_t dst_id, src, dst):
    # submit and wait without the GIL: (submit status, wait status)
    cdef vector[uint64_t] s = src
    cdef vector[uint64_t] d = dst
    cdef CLlmDataDist* p = dd.native()
    cdef CTransferHandle h
    cdef Status st, wst = 0
    with nogil:
        st = pull_blocks_async_nogil(p, cluster, src_id, dst_id, s.data(), d.data(), s.size(), -1, -1, -1, -1, 2,
                                     &h)
        if st == 0:
            wst = wait_transfer_nogil(&h, -1)
    return st, wst


def push_async(LlmDataDist dd, int64_t src_id, uint32_t num_tensors, uint64_t cluster, int64_t dst_id, src, dst):
    cdef vector[uint64_t] s = src
    cdef vector[uint64_t] d = dst
    cdef CLlmDataDist* p = dd.native()
    cdef CTransferHandle h
    cdef Status st, wst = 0
    with nogil:
        st = push_blocks_async_nogil(p, src_id, num_tensors, cluster, dst_id, s.data(), d.data(), s.size(),
                                     -1, -1, -1, -1, 2, &h)
        if st == 0:
            wst = wait_transfer_nogil(&h, 10000)
    return st, wst


def layer_push(LlmDataDist dd, int64_t src_id, uint32_t num_tensors, uint64_t cluster, int64_t dst_id, src, dst,
               int tnpl):
    # open, every layer ready, finish: all without the GIL; (open, last ready, finish) statuses
    cdef vector[uint64_t] s = src
    cdef vector[uint64_t] d = dst
    cdef CLlmDataDist* p = dd.native()
    cdef CLayerPush lp
    cdef Status st, rst = 0, fst = 0
    cdef uint32_t layer
    with nogil:
        st = open_layer_push_nogil(p, src_id, num_tensors, cluster, dst_id, s.data(), d.data(), s.size(),
                                   <unsigned char>tnpl, &lp)
        if st == 0:
            for layer in range(num_tensors // tnpl):
                rst = layer_ready_nogil(&lp, layer)
            fst = finish_layer_push_nogil(&lp, -1)
    return st, rst, fst
'''

SETUP = '''
import sys
from Cython.Build import cythonize
from setuptools import Extension, setup

inc, pkg_dir, pkg_root = sys.argv.pop(1), sys.argv.pop(1), sys.argv.pop(1)
ext = Extension("downstream", ["downstream.pyx"], language="c++", include_dirs=[inc, pkg_dir],
                library_dirs=[pkg_dir], libraries=["llm_datadist"], runtime_library_dirs=[pkg_dir],
                extra_compile_args=["-std=c++17"])
setup(ext_modules=cythonize([ext], include_path=[pkg_root], compiler_directives={"language_level": 3}),
      script_args=sys.argv[1:])
'''

RUN = '''
import socket
import numpy as np
import kvblocks as kb
import downstream

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
p = kb.LlmDataDist(1, kb.LlmRole.PROMPT)
d = kb.LlmDataDist(2, kb.LlmRole.DECODER)
p.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{port}"})
d.initialize({kb.OPTION_DEVICE_ID: "0"})
src = [np.arange(64, dtype=np.int32).reshape(8, 8) + 1000 * t for t in range(4)]
dst = [np.zeros((8, 8), np.int32) for _ in range(4)]
pc = p.register_arrays(src)
dc = d.register_arrays(dst)
rets = d.link_llm_clusters([kb.ClusterInfo(1, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", port)])])
assert rets == [kb.Status.LLM_SUCCESS], rets
st = downstream.pull(d, 1, pc.cache_id, dc.cache_id, [1, 3, 5, 7], [0, 2, 4, 6])
assert st == 0, hex(st)
for t in range(4):
    want = np.zeros((8, 8), np.int32)
    want[[0, 2, 4, 6]] = src[t][[1, 3, 5, 7]]
    assert dst[t].tobytes() == want.tobytes(), t
# push layer 3 only (one tensor per layer): blocks 0..3 -> 7..4
st = downstream.push(p, pc.cache_id, 4, 2, dc.cache_id, [0, 1, 2, 3], [7, 6, 5, 4], 3, 3, 1)
assert st == 0, hex(st)
assert dst[3][[7, 6, 5, 4]].tobytes() == src[3][[0, 1, 2, 3]].tobytes()
assert not dst[2][[5, 7]].any()  # layer 2 untouched by the push
# an error comes back as a status, not an exception
st = downstream.pull(d, 1, pc.cache_id, dc.cache_id, [0], [99])
assert st == 0x5010B005, hex(st)
# asynchronous: submit + wait from nogil code; a bad index fails at submission, nothing submitted
for t in range(4):
    dst[t][:] = 0
assert downstream.pull_async(d, 1, pc.cache_id, dc.cache_id, [6, 7], [1, 0]) == (0, 0)
assert dst[1][[1, 0]].tobytes() == src[1][[6, 7]].tobytes() and not dst[1][2:].any()
assert downstream.pull_async(d, 1, pc.cache_id, dc.cache_id, [0], [99]) == (0x5010B005, 0)
assert downstream.push_async(p, pc.cache_id, 4, 2, dc.cache_id, [2], [5]) == (0, 0)
assert dst[0][5].tobytes() == src[0][2].tobytes()
# layer-wise push from nogil code
for t in range(4):
    dst[t][:] = 0
assert downstream.layer_push(p, pc.cache_id, 4, 2, dc.cache_id, [4, 5], [0, 3], 2) == (0, 0, 0)
assert all(dst[t][[0, 3]].tobytes() == src[t][[4, 5]].tobytes() for t in range(4))
assert downstream.layer_push(p, pc.cache_id, 4, 2, dc.cache_id, [4], [99], 2)[0] == 0x5010B005
d.finalize()
p.finalize()
print("nogil ok")
'''


def test_downstream_extension_cimports_and_moves_data(tmp_path):
    pytest.importorskip("numpy")
    (tmp_path / "downstream.pyx").write_text(textwrap.dedent(PYX))
    (tmp_path / "setup.py").write_text(SETUP)
    (tmp_path / "run.py").write_text(RUN)
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "setup.py", kvblocks.get_include(), PKG_DIR, PKG_ROOT, "build_ext",
                        "--inplace"], cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    r = subprocess.run([sys.executable, "run.py"], cwd=str(tmp_path), capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "nogil ok" in r.stdout, r.stdout + r.stderr
