# SPDX-License-Identifier: Apache-2.0
"""The harness of the backend contract suite (tests/contract/test_contract.py): one link per backend
between this process's engine and a real second engine, plus the measured scheduler latency that
every wait of the suite is derived from.

A backend is reached the way a user reaches it:

* ``inprocess``: a second engine in this process;
* ``shm``: a peer process (tests/peer.py) whose cache is runtime-allocated shared memory (a memfd);
* ``cma``: a peer process whose cache is registered numpy arrays (cross-memory attach);
* ``tcp``: a peer process, both engines with ``kvblocks.Transport=tcp``;
* ``ucx``: a peer process, both with ``kvblocks.Transport=ucx`` over ``UCX_TLS=tcp`` (skipped unless the
  kvblocks-ucx plugin is installed; ``.ci/ucx.sh`` runs the suite with it).

Each test checks, from the engine's own metrics, that its transfers really ran on the backend under test.
A new backend adds one entry to BACKENDS and a branch in ``Linked``.
"""
import hashlib
import os
import signal
import threading
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from procs import Peer, read_process_memory, wait_dead, wait_stopped
from ucx_env import ucx_available

BACKENDS = ["inprocess", "shm", "cma", "tcp", "ucx"]
# Backends whose transfers the peer's own threads serve (a frozen peer stalls them); the others copy
# one-sided, from this process, through the peer's memory.
SERVED = {"tcp", "ucx"}
# What the README documents as a backend's exception to "no byte changes after the call returned":
# a timed-out UCX push may still land in the *pushed* blocks of the peer (README, "Across hosts").
LATE_PUSH_INTO_PUSHED_BLOCKS = {"ucx"}
TRUSTED = {kb.OPTION_UCX_TRUSTED_NETWORK: "1"}

# 32 tensors x 64 blocks x 64 KiB = 128 MiB a call: no path moves it in 2 ms (64 GB/s), and far more
# than the socket buffers hold. Tests that need no volume use 1 KiB blocks (2 MiB a cache).
T, B, BB = 32, 64, 64 * 1024
SMALL_BB = 1024
# The deadline contract: a call returns by SyncKvCacheWaitTime + 10 ms on an idle machine (README);
# on a loaded one the measured wake-up lateness is added (Scheduler.allowance).
CONTRACT_SLACK_S = 0.010


class Scheduler:
    """Wake-up lateness of this machine now, measured: how late a thread that asked to wake runs. The
    suite's allowances and settle windows are multiples of it, never fixed sleeps."""

    def __init__(self, samples=200):
        self.lateness = self.measure(samples)

    @staticmethod
    def measure(samples):
        """The worst lateness (s) of ``samples`` 1 ms sleeps, at least 1 ms."""
        worst = 0.0
        for _ in range(samples):
            t0 = time.monotonic()
            time.sleep(0.001)
            worst = max(worst, time.monotonic() - t0 - 0.001)
        return max(worst, 0.001)

    def allowance(self):
        """What a deadline may be exceeded by: the contract's 10 ms plus a few wake-ups (a call's
        return passes through about three threads), re-measured so load that came later counts."""
        self.lateness = max(self.lateness, self.measure(50))
        return CONTRACT_SLACK_S + 6 * self.lateness

    def settle(self):
        """How long a destination is watched after a call returned: a copy still running then (the
        bug looked for) lands within a chunk time plus a few wake-ups; 25 wake-ups, 50 ms at least."""
        return max(0.05, 25 * self.lateness)


def _snapshot(get):
    return hashlib.sha256(get()).hexdigest()


def watch(get, window_s, step_s=0.005):
    """Reads ``get()`` (bytes) repeatedly for ``window_s``; returns the digests seen, first to last
    (one digest: nothing changed)."""
    seen = [_snapshot(get)]
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        time.sleep(step_s)
        d = _snapshot(get)
        if d != seen[-1]:
            seen.append(d)
    return seen


def engine(cid, transport, wait_ms, listen=True):
    """An initialized MIX engine for ``transport`` (a backend name), listening on a free port."""
    e = kb.LlmDataDist(cid, kb.LlmRole.MIX)
    opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms),
            kb.OPTION_TRANSPORT: transport if transport in ("tcp", "ucx") else "auto"}
    if transport == "ucx":
        opts.update(TRUSTED)
    if listen:
        opts[kb.OPTION_LISTEN_IP_INFO] = f"127.0.0.1:{free_port()}"
    e.initialize(opts)
    return e


def port_of(e):
    return int(e.listen_address.rsplit(":", 1)[1])


class Linked:
    """This process's engine ``me`` (cluster 2) and the other side (cluster 1) on ``backend``.

    ``local`` is our cache (runtime-allocated; registered arrays when ``local_arrays``), filled with
    ``0xEE``; ``remote`` the index of the other side's cache, filled with its pattern (tests/peer.py).
    ``link`` is False for tests that link themselves (the racing link, links opened by the peer);
    ``small``: 1 KiB blocks instead of 64 KiB (``bb``).
    """

    def __init__(self, backend, wait_ms=1000, link=True, local_arrays=False, small=False):
        self.bb = SMALL_BB if small else BB
        if backend == "ucx" and not ucx_available():
            pytest.skip("the ucx extra (kvblocks-ucx) is not installed")
        self.backend = backend
        self.peer = self.other = None
        self.me = engine(2, backend, wait_ms)
        try:
            self._start_other(backend)
            if local_arrays:
                self.arrays = [np.full((B, self.bb), 0xEE, np.uint8) for _ in range(T)]
                self.local = self.me.register_arrays(self.arrays)
                self.views = self.arrays
            else:
                self.local = self.me.allocate_cache(kb.CacheDesc(T, kb.DataType.DT_UINT8, [B, self.bb]))
                self.views = [self.local.numpy(t) for t in range(T)]
                for v in self.views:
                    v[:] = 0xEE
            if link:
                self.link()
        except BaseException:
            self.close()
            raise

    def _start_other(self, backend):
        if backend == "inprocess":
            self.other = engine(1, backend, 5000)
            self.port = port_of(self.other)
            self.other_cache = self.other.allocate_cache(kb.CacheDesc(T, kb.DataType.DT_UINT8, [B, self.bb]))
            from peer import pattern
            for t in range(T):
                self.other_cache.numpy(t)[:] = pattern(1, t, B, self.bb)
            self.remote = kb.CacheIndex(1, self.other_cache.cache_id)
            self.remote_kind = "alloc"
            return
        self.port = free_port()
        opts = TRUSTED if backend == "ucx" else None
        self.peer = Peer(1, listen=f"127.0.0.1:{self.port}", transport=backend if backend in SERVED else "auto",
                         tensors=T, blocks=B, block_bytes=self.bb, wait_ms=5000, options=opts)
        # cma serves registered arrays; shm (and the served paths) runtime-allocated memfd caches.
        self.remote_kind = "reg" if backend == "cma" else "alloc"
        self.remote = kb.CacheIndex(1, self.peer.info[self.remote_kind])

    # ------------------------------------------------------------------ the link
    def link(self, timeout_ms=5000):
        assert self.me.link_llm_clusters([cluster(1, self.port)], timeout_ms) == [kb.Status.LLM_SUCCESS]

    def peer_links_to_me(self):
        """Sends the peer's link command to our listener without waiting (pair with peer.reply())."""
        self.peer.send(op="link", cluster=2, ip="127.0.0.1", port=port_of(self.me))

    # ------------------------------------------------------------------ the other side's memory
    @property
    def pid(self):
        return None if self.peer is None else self.peer.info["pid"]

    def remote_bytes(self, blocks=None):
        """The other side's cache (all of it, or ``blocks``' bytes of each tensor), read without its help."""
        sl = slice(None) if blocks is None else blocks
        if self.other is not None:
            return b"".join(self.other_cache.numpy(t)[sl].tobytes() for t in range(T))
        out = []
        for a in self.peer.info["addrs"][self.remote_kind]:
            tensor = read_process_memory(self.pid, a, B * self.bb)
            out.append(np.frombuffer(tensor, np.uint8).reshape(B, self.bb)[sl].tobytes())
        return b"".join(out)

    def local_bytes(self, blocks=None):
        sl = slice(None) if blocks is None else blocks
        return b"".join(v[sl].tobytes() for v in self.views)

    def local_filled(self, value=0xEE):
        return all(not (v != value).any() for v in self.views)

    # ------------------------------------------------------------------ failures of the other side
    def freeze(self):
        os.kill(self.pid, signal.SIGSTOP)
        wait_stopped(self.pid)

    def thaw_and_sync(self):
        """Resumes the peer and returns once its main thread has answered a command: it runs again."""
        os.kill(self.pid, signal.SIGCONT)
        self.peer.call(op="path", cluster=2)

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        wait_dead(self.pid)
        self.peer.proc.wait()

    # ------------------------------------------------------------------ which backend ran
    def paths_used(self, writer=False):
        """{path name: transfers counted} in our engine's metrics towards cluster 1 (``writer``: in the
        other side's metrics towards us, for the transfers it made)."""
        if not writer:
            metrics, towards = self.me.metrics(), 1
        else:
            metrics = self.other.metrics() if self.other is not None else self.peer.call(op="metrics")["metrics"]
            towards = 2
        used = {}
        for p in metrics["peers"]:
            if p["peer"] != towards:
                continue
            for path in p["paths"]:
                n = sum(k["count"] for k in path["kinds"])
                if n:
                    used[path["path"]] = used.get(path["path"], 0) + n
        return used

    def assert_ran_on_backend(self, writer=False):
        used = self.paths_used(writer)
        used.pop("none", None)  # requests refused before any path was chosen (an unknown cache id)
        assert set(used) == {self.backend}, f"the transfers ran on {used}, not on {self.backend}"

    def close(self):
        """Finalizes both sides (once; the fixture closes what a test closed already)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.peer is not None:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.me.finalize()
        if self.other is not None:
            self.other.finalize()
        if self.peer is not None:
            self.peer.close(kill=self.peer.proc.poll() is not None)


def timed(fn):
    """(status, seconds) of ``fn()``: LLM_SUCCESS or the status it raised."""
    t0 = time.monotonic()
    try:
        fn()
        st = kb.Status.LLM_SUCCESS
    except kb.LLMException as e:
        st = e.status_code
    return st, time.monotonic() - t0


def start(fn):
    """Runs ``fn`` on a thread; returns (thread, out) where out gets "status", "elapsed" and "end"."""
    out = {}

    def run():
        out["status"], out["elapsed"] = timed(fn)
        out["end"] = time.monotonic()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out
