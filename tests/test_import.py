# SPDX-License-Identifier: Apache-2.0
"""``import kvblocks`` must not import numpy (issue 2 §4); numpy loads only in ``Cache.numpy()``."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(code):
    env = dict(os.environ)
    # Import the package this test suite belongs to, whether installed or built in place.
    import kvblocks
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_import_leaves_numpy_out():
    assert run("import sys, kvblocks; print('numpy' in sys.modules)") == "False"


def test_api_use_leaves_numpy_out():
    code = """
import sys, kvblocks as kb
d = kb.LlmDataDist(1, kb.LlmRole.MIX)
d.initialize({kb.OPTION_DEVICE_ID: "0"})
c = d.allocate_cache(kb.CacheDesc(2, kb.DataType.DT_INT32, [4, 16]))
c.tensor(0)[:4] = b"abcd"
d.copy_kv_blocks(c, c, [0], [[1]])
assert bytes(c.tensor(0)[64:68]) == b"abcd"
print('numpy' in sys.modules)
c.numpy(0)
print('numpy' in sys.modules)
d.finalize()
"""
    assert run(code).split() == ["False", "True"]


def test_import_and_metrics_leave_prometheus_client_out():
    """kvblocks[prometheus] is optional: neither `import kvblocks` nor kvblocks.metrics() loads it."""
    code = ("import sys, kvblocks; kvblocks.metrics(); "
            "print('prometheus_client' in sys.modules, 'kvblocks.prometheus' in sys.modules)")
    assert run(code) == "False False"


def test_import_leaves_lmcache_and_its_channel_out():
    """kvblocks.lmcache is loaded only by its launcher or by hand; importing it does not import LMCache."""
    code = ("import sys, kvblocks; a = ('kvblocks.lmcache' in sys.modules, 'lmcache' in sys.modules); "
            "import kvblocks.lmcache; print(*a, 'lmcache' in sys.modules)")
    assert run(code) == "False False False"
