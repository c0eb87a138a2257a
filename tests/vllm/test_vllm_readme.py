# SPDX-License-Identifier: Apache-2.0
"""The README's "Use with vLLM" commands, run verbatim: two OpenAI servers with KvblocksConnector and
the client that hands a prompt from the prefill to the decode.

Only ``$MODEL`` comes from here: the tiny random checkpoint (with a locally trained tokenizer) that the
other vLLM tests use. The server ports (8100, 8200, 26100-26101) are the README's.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

try:
    import transformers  # noqa: F401
    import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401  (a bare "vllm" could be this folder)
except Exception as e:  # noqa: BLE001
    pytest.skip(f"vLLM is not importable ({type(e).__name__}: {e})", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import make_model, record_cpu  # noqa: E402

pytestmark = pytest.mark.vllm
README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")
START_S = 600


def section_blocks():
    text = open(README).read()
    start = text.index("## Use with vLLM")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```bash\n(.*?)```", text[start:end], re.S)


def commands(block):
    """The block's commands, continuation lines joined."""
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def healthy(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_readme_serve_and_client_commands_work_verbatim(tmp_path):
    blocks = section_blocks()
    serve, client = blocks[1], blocks[2]
    # as in an activated venv: `python` is this interpreter
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, MODEL=make_model(str(tmp_path / "model")), PATH=bindir + os.pathsep + os.environ["PATH"],
               VIRTUAL_ENV=os.path.dirname(bindir))
    servers = []
    try:
        for i, cmd in enumerate(commands(serve)):
            log = open(tmp_path / f"server{i}.log", "w")
            servers.append((subprocess.Popen(["bash", "-c", cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                                             process_group=0, cwd=str(tmp_path)), tmp_path / f"server{i}.log"))
        ports = [int(re.search(r"--port (\d+)", c).group(1)) for c in commands(serve)]
        deadline = time.monotonic() + START_S
        while not all(healthy(p) for p in ports):
            for proc, log in servers:
                assert proc.poll() is None, f"server exited {proc.returncode}:\n{open(log).read()[-4000:]}"
            assert time.monotonic() < deadline, "servers did not start"
            time.sleep(1)
        r = subprocess.run(["bash", "-c", client], env=env, capture_output=True, text=True, timeout=300,
                           cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert isinstance(out["choices"][0]["text"], str) and out["usage"]["completion_tokens"] > 0, out
        decode_log = open(servers[1][1]).read()
        assert "Traceback" not in decode_log and "failed (" not in decode_log, decode_log[-4000:]
        # the pull's statistics on the decode server's own /metrics (over HTTP, from its engine core)
        lines = []
        deadline = time.monotonic() + 20
        while _count(lines) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/metrics", timeout=10) as resp:
                lines = [x for x in resp.read().decode().splitlines() if x.startswith("vllm:kvblocks")]
        print("\n/metrics of the decode server, vllm:kvblocks_* (buckets left out):\n" +
              "\n".join(x for x in lines if "_bucket" not in x and "_created" not in x))
        assert _count(lines) == 1, lines
        assert _value(lines, "vllm:kvblocks_pulled_bytes_total") > 0
        assert _value(lines, "vllm:kvblocks_failed_pulls_total") == 0
    finally:
        for proc, _ in servers:
            stop(proc)


def _value(lines, name):
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.split("{")[0] == name)


def _count(lines):
    return _value(lines, "vllm:kvblocks_pull_time_seconds_count")


def stop(proc):
    if proc.poll() is None:
        record_cpu(f"readme-server-{proc.pid}", proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
