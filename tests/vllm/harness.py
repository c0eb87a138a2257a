# SPDX-License-Identifier: Apache-2.0
"""Start vLLM engines in their own processes (``engine_proc.py``) and talk to them (vLLM tests, bench)."""
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from ports import free_port  # noqa: E402,F401  (tests import it from here)
from procs import wait_stopped  # noqa: E402
ENGINE = os.path.join(HERE, "engine_proc.py")


_MODEL: List[str] = []  # the checkpoint this process wrote first


def make_model(path: str) -> str:
    """Writes the tiny random checkpoint (engine_proc.py) at ``path``. It is the same every time (fixed
    seed), so after the first in a process ``path`` links to that one: writing it starts torch and
    transformers in a new process, seconds of CPU per test module."""
    if _MODEL and os.path.isfile(os.path.join(_MODEL[0], "config.json")):
        os.symlink(_MODEL[0], path)
        return path
    subprocess.run([sys.executable, ENGINE, "--make-model", path], check=True, capture_output=True, timeout=300)
    _MODEL[:] = [path]
    return path


def group_cpu(pgid: int) -> Dict[str, float]:
    """CPU seconds (user + system, with their reaped children's) of process group ``pgid`` now: "group"
    over all its processes, "leader" of ``pgid`` itself (a parent that waits for the leader counts that
    part again). For the suite's CPU accounting (``KVB_ENGINE_CPU_FILE``)."""
    tck = os.sysconf("SC_CLK_TCK")
    group = leader = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) != pgid:  # field 5: pgrp
            continue
        cpu = sum(int(x) for x in fields[11:15]) / tck  # fields 14-17: utime stime cutime cstime
        group += cpu
        leader += cpu if int(pid) == pgid else 0.0
    return {"group": round(group, 1), "leader": round(leader, 1)}


def record_cpu(name: str, pgid: int, **extra: Any) -> None:
    """Appends ``name``'s group CPU (and ``extra``) to the file ``KVB_ENGINE_CPU_FILE`` names, if any."""
    path = os.environ.get("KVB_ENGINE_CPU_FILE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(name=name, cpu_s=group_cpu(pgid), **extra)) + "\n")


class EngineExited(RuntimeError):
    """The engine process is gone (or going): its log's tail says why."""


class Engine:
    """One engine process (its own process group, so it can be frozen or killed with all its children).
    Not its own session: with autogroup scheduling each session is a CPU group, and this machine's
    kernel (6.18) starved a whole engine pinned to CPU 0 for 70-100 s behind another engine's group
    whose worker spun on sched_yield ("BUG: workqueue lockup ... stuck for 99s" in dmesg)."""

    def __init__(self, name: str, model_dir: str, kv_transfer: Optional[Dict[str, Any]], cpu: int,
                 env: Optional[Dict[str, str]] = None, log_dir: Optional[str] = None, prefix_caching: bool = True,
                 log_stats: bool = False, block_size: int = 32, tp: int = 1, one_process: bool = True):
        self.name = name
        e = dict(os.environ)
        e.update({"VLLM_CPU_OMP_THREADS_BIND": str(cpu), "PYTHONPATH": HERE + os.pathsep + e.get("PYTHONPATH", ""),
                  "VLLM_LOGGING_LEVEL": e.get("VLLM_LOGGING_LEVEL", "INFO"), "TOKENIZERS_PARALLELISM": "false",
                  "PYTHONFAULTHANDLER": "1"})  # a worker killed by a signal says which, and where
        e.update(env or {})
        self.log_path = os.path.join(log_dir or "/tmp", f"vllm-{name}-{os.getpid()}.log")
        self._log = open(self.log_path, "w")
        cfg = {"kv_transfer": kv_transfer, "prefix_caching": prefix_caching, "log_stats": log_stats,
               "block_size": block_size, "tp": tp, "one_process": one_process}
        self.proc = subprocess.Popen([sys.executable, ENGINE, model_dir, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=e, text=True, bufsize=1,
                                     process_group=0)
        self._ready = False
        self._t0 = time.monotonic()
        self._start: Dict[str, Any] = {}

    def _readline(self, timeout: float) -> Dict[str, Any]:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"{self.name}: no answer within {timeout:.0f} s; log {self.log_path}:\n{self.tail()}")
        line = self.proc.stdout.readline()
        if not line:
            raise self._exited()
        return json.loads(line)

    def wait_ready(self, timeout: float = 300) -> "Engine":
        if not self._ready:
            assert self._readline(timeout).get("ready")
            self._ready = True
            self._start = {"start_wall_s": round(time.monotonic() - self._t0, 1),
                           "start_cpu_s": group_cpu(self.proc.pid)}
        return self

    def generate(self, prompts: List[List[int]], max_tokens: int, params: Optional[List[Any]] = None,
                 timeout: float = 120) -> Dict[str, Any]:
        self.submit(prompts, max_tokens, params)
        return self.result(timeout)

    def submit(self, prompts: List[List[int]], max_tokens: int, params: Optional[List[Any]] = None) -> None:
        """Starts a generate without waiting for it (pair with :meth:`result`): the client can talk to
        another engine meanwhile, as a layer-wise push needs."""
        self.wait_ready()
        try:
            self.proc.stdin.write(json.dumps({"op": "generate", "prompts": prompts, "max_tokens": max_tokens,
                                              "params": params}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._exited() from None

    def result(self, timeout: float = 120) -> Dict[str, Any]:
        return self._readline(timeout)

    def metrics(self, prefix: str = "vllm:kvblocks", timeout: float = 60) -> List[str]:
        """Lines of vLLM's Prometheus exposition (its /metrics) starting with ``prefix``."""
        self.wait_ready()
        try:
            self.proc.stdin.write(json.dumps({"op": "metrics", "prefix": prefix}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._exited() from None
        return self._readline(timeout)["lines"]

    def _exited(self) -> EngineExited:
        return EngineExited(f"{self.name} exited ({self.proc.poll()}); log {self.log_path}:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        """The log's last ``n`` lines, after the first fatal error's (a dead worker's cause is often
        far above the engine's own last words)."""
        try:
            with open(self.log_path) as f:
                lines = f.readlines()
        except OSError:
            return ""
        first = next((i for i, ln in enumerate(lines) if "Fatal Python error" in ln or "died" in ln), None)
        head = lines[first:first + 15] + ["...\n"] if first is not None and first < len(lines) - n else []
        return "".join(head + lines[-n:])

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def _group_pids(self) -> List[int]:
        """Every process in this engine's process group (vLLM's engine core and workers too)."""
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == self.proc.pid:  # field 5: pgrp
                        out.append(int(pid))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
        return out

    def freeze(self, timeout: float = 10) -> None:
        """SIGSTOPs the engine's process group and returns once every thread of it is stopped: the
        signal is asynchronous, and a thread that has not stopped yet still serves. Raises
        AssertionError when some thread is not stopped within ``timeout``."""
        self.signal(signal.SIGSTOP)
        for pid in self._group_pids():
            wait_stopped(pid, timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            record_cpu(self.name, self.proc.pid, wall_s=round(time.monotonic() - self._t0, 1), **self._start)
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        if self.proc.poll() is None or True:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # also any orphaned engine-core/worker children
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def kvblocks_config(role: str, port: int = 0, **extra: Any) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {"kv_connector": "TimedKvblocksConnector", "kv_connector_module_path": "timed_connectors",
                           "kv_role": role, "kv_connector_extra_config": dict(extra)}
    if role == "kv_producer":
        cfg["kv_connector_extra_config"]["listen"] = f"127.0.0.1:{port}"
    else:
        cfg["kv_load_failure_policy"] = "recompute"
    return cfg


LEASE_S = 100  # kv_both's abort_timeout_s: a request freed sooner was freed by its decode ranks' notices


def kv_both(port, **extra):
    """A kv_both KvblocksConnector config (timed) listening on ``port`` (+ rank with TP)."""
    return {"kv_connector": "TimedKvblocksConnector", "kv_connector_module_path": "timed_connectors",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": dict(listen=f"127.0.0.1:{port}", abort_timeout_s=LEASE_S,
                                              # generous deadlines: on a loaded 2-core host a TP worker's
                                              # kvblocks threads wait seconds for a CPU (a missed one
                                              # recomputes, and the tokens would prove nothing)
                                              pull_timeout_ms=30000, link_timeout_ms=20000,
                                              _test_swap_ranks="per_request", _test_reverse_blocks="per_request",
                                              _test_rotate_heads="per_request", **extra)}


def nixl_config(role: str) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {"kv_connector": "TimedNixlConnector", "kv_connector_module_path": "timed_connectors",
                           "kv_role": role, "kv_buffer_device": "cpu"}
    if role != "kv_producer":
        cfg["kv_load_failure_policy"] = "recompute"
    return cfg


def median(xs: List[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def wait_until(pred, timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()
