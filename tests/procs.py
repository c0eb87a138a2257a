# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests with real second processes: tests/peer.py driven over stdin/stdout (Peer), and
process pairs run side by side (run_together). Both fail as soon as a process they wait for dies."""
import glob
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")


# How long a helper waits for a peer that is alive but silent; a peer that exits is noticed at once.
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0
POLL_S = 0.02


class PeerError(RuntimeError):
    """A peer process exited (or stayed silent) while the test waited for it."""


def _exit_text(code):
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


class Peer:
    """A kvblocks process (tests/peer.py) driven over its stdin/stdout.

    Every wait for a reply watches the process too: if it exits, the call fails at once with its exit
    code and stderr instead of waiting out a timeout.
    """

    def __init__(self, cluster, listen="", transport="auto", tensors=4, blocks=8, block_bytes=64, wait_ms=1000,
                 auth=None, prefix=(), role="MIX", argv=None, start_timeout=START_TIMEOUT_S, options=None):
        if argv is None:
            argv = [PEER, "--cluster", str(cluster), "--transport", transport, "--tensors", str(tensors),
                    "--blocks", str(blocks), "--block-bytes", str(block_bytes), "--wait-ms", str(wait_ms),
                    "--role", role]
            if listen:
                argv += ["--listen", listen]
            if auth is not None:
                argv += ["--auth", auth]
            for k, v in (options or {}).items():
                argv += ["--option", f"{k}={v}"]
        cmd = list(prefix) + [sys.executable, *argv]
        env = dict(os.environ)
        # stderr goes to a file: nothing has to drain it, and it can be read while the peer runs.
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, env=env)
        self._buf = b""
        self.stderr_text = ""
        self.cluster, self.tensors, self.blocks, self.block_bytes = cluster, tensors, blocks, block_bytes
        try:
            self.info = json.loads(self._readline(start_timeout, "to start"))
        except BaseException:
            self.close(kill=True)
            raise

    def wait_stderr(self, text, timeout=10.0):
        """Whether ``text`` appears on the peer's stderr within ``timeout`` s (a runtime thread may
        log it after the call that caused it returned on the other side)."""
        deadline = time.monotonic() + timeout
        while True:
            if text in self._stderr():
                return True
            if time.monotonic() >= deadline or self.proc.poll() is not None:
                return text in self._stderr()
            time.sleep(0.02)

    def _stderr(self):
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def _readline(self, timeout, what):
        """One line of the peer's stdout; fails as soon as the peer exits or after ``timeout`` s."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerError(f"peer (pid {self.proc.pid}) did not answer {what} within {timeout:g} s; "
                                f"stderr:\n{self._stderr()}")
            ready, _, _ = select.select([fd], [], [], min(left, POLL_S))
            chunk = os.read(fd, 65536) if ready else None
            if chunk:
                self._buf += chunk
            elif chunk == b"" or self.proc.poll() is not None:
                try:
                    code = self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None  # stdout closed but the process lingers
                state = "closed its stdout" if code is None else _exit_text(code)
                raise PeerError(f"peer (pid {self.proc.pid}) {state} while the test waited for it {what}; "
                                f"stderr:\n{self._stderr()}")
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def send(self, **cmd):
        """Sends a command without waiting (pair with reply()), so the peer acts while the test does."""
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: _readline reports how

    def reply(self, timeout=CALL_TIMEOUT_S):
        return json.loads(self._readline(timeout, "to answer"))

    def call(self, timeout=CALL_TIMEOUT_S, **cmd):
        self.send(**cmd)
        return json.loads(self._readline(timeout, f"to answer {cmd.get('op')!r}"))

    def digest(self):
        return self.call(op="digest")["digest"]

    def read(self, cache, tensor):
        return np.frombuffer(bytes.fromhex(self.call(op="read", cache=cache, tensor=tensor)["hex"]), dtype=np.uint8)

    def close(self, kill=False):
        if self.proc.poll() is None and kill:
            self.proc.kill()
            self.proc.wait()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write((json.dumps({"op": "exit"}) + "\n").encode())
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        if not self._err.closed:
            self.stderr_text = self._stderr()
            self._err.close()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:
                pass


def run_together(cmds, timeout, names=None, **popen_kw):
    """Runs the commands side by side and returns their outputs (stdout and stderr) once all exit 0.

    The first one that exits non-zero fails the call at once -- the others are killed, not waited for
    (they would only wait out their own timeouts for it) -- with its name, exit code and output;
    so does the ``timeout`` (seconds, for all of them together).
    """
    names = list(names) if names is not None else [" ".join(map(str, c)) for c in cmds]
    files = [tempfile.TemporaryFile() for _ in cmds]
    procs = []
    try:
        for c, f in zip(cmds, files):
            procs.append(subprocess.Popen(c, stdout=f, stderr=subprocess.STDOUT, **popen_kw))
        deadline = time.monotonic() + timeout
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    outs = []
    for f in files:
        f.seek(0)
        outs.append(f.read().decode(errors="replace"))
        f.close()
    if failed is not None:
        others = "".join(f"\n--- {n} ({_exit_text(p.returncode)}):\n{o}"
                         for j, (n, p, o) in enumerate(zip(names, procs, outs)) if j != failed)
        raise AssertionError(f"{names[failed]} {_exit_text(procs[failed].returncode)}:\n{outs[failed]}{others}")
    running = [n for n, p in zip(names, procs) if p.returncode != 0]
    if running:
        raise AssertionError(f"still running after {timeout:g} s (killed): {', '.join(running)}\n" +
                             "".join(f"--- {n}:\n{o}\n" for n, o in zip(names, outs)))
    return outs


def read_process_memory(pid: int, addr: int, n: int) -> bytes:
    """Reads another process's memory through /proc (works while it is SIGSTOPped)."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
        f.seek(addr)
        return f.read(n)


def release(peer, engine):
    """Fixture teardown after freezing tests: resumes the peer if it still exists, then finalizes
    our engine and closes the peer."""
    try:
        os.kill(peer.info["pid"], signal.SIGCONT)
    except ProcessLookupError:
        pass
    engine.finalize()
    peer.close()


def _thread_states(pid):
    """The state letter of every thread of ``pid`` still listed in /proc."""
    states = []
    for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue  # a thread that ended
        states.append(text[text.rindex(")") + 2])  # the field after "(comm)"
    return states


def _wait_threads(pid, done, what, timeout_s):
    """Polls the thread states of ``pid`` until ``done(states)``; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = _thread_states(pid)
        if done(states):
            return
        assert time.monotonic() < deadline, f"peer {pid} not {what} after {timeout_s} s: states {states}"
        time.sleep(0.001)


def wait_stopped(pid, timeout_s=10.0):
    """Returns once every thread of ``pid`` is stopped (state T in /proc/<pid>/task/*/stat):
    SIGSTOP is asynchronous, and a thread still running could finish the transfer."""
    _wait_threads(pid, lambda states: states and all(st in "Tt" for st in states), "stopped", timeout_s)


def wait_dead(pid, timeout_s=10.0):
    """Returns once no thread of ``pid`` can run (each gone, or a zombie): SIGKILL is asynchronous
    too, and lands only when the process next runs in the kernel."""
    _wait_threads(pid, lambda states: all(st in "ZX" for st in states), "dead", timeout_s)
