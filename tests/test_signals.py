# SPDX-License-Identifier: Apache-2.0
"""Signals: runtime threads block every asynchronous signal, so Python's handlers run on the main
thread; system calls interrupted there (EINTR) are retried, so transfers succeed under a storm."""
import glob
import os
import signal
import threading
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import Pair
from peer import pattern

TENSORS, BLOCKS, BB = 8, 16, 64 * 1024  # 8 MiB a transfer: many reads and writes, each interruptible
RUNTIME_THREAD = "kvblocks-rt"  # the name every runtime thread carries (engine/lifecycle.cc)
ASYNC = [signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD,
         signal.SIGPIPE, signal.SIGHUP, signal.SIGWINCH]
FAULTS = [signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL]


def _tasks():
    """(tid, name, blocked signal mask) of every thread of this process."""
    out = []
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(os.path.join(task, "comm")) as f:
                name = f.read().strip()
            with open(os.path.join(task, "status")) as f:
                blk = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we looked
        out.append((int(os.path.basename(task)), name, blk))
    return out


def _blocked(mask, sig):
    return bool(mask >> (int(sig) - 1) & 1)


def _mix_pair():
    return Pair({kb.OPTION_TRANSPORT: "tcp"}, {kb.OPTION_TRANSPORT: "tcp"}, role_p=kb.LlmRole.MIX,
                role_d=kb.LlmRole.MIX)


def _link(p):
    p.link()  # after the remote caches exist: a link sees the caches of its time
    assert p.d.link_path(1) == "tcp"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_runtime_threads_block_asynchronous_signals():
    p = _mix_pair()
    try:
        desc = kb.CacheDesc(2, kb.DataType.DT_UINT8, [4, 64])
        src, dst = p.p.allocate_cache(desc), p.d.allocate_cache(desc)
        _link(p)
        p.d.pull_kv_blocks(kb.CacheIndex(1, src.cache_id), dst, [0, 1], [0, 1])
        runtime = [t for t in _tasks() if t[1] == RUNTIME_THREAD]
        # At least the listener, the two control loops and the serving side of the data channel.
        assert len(runtime) >= 3, _tasks()
        for tid, _, mask in runtime:
            for sig in ASYNC:
                assert _blocked(mask, sig), f"thread {tid} does not block {sig.name} (SigBlk {mask:016x})"
            for sig in FAULTS:
                assert not _blocked(mask, sig), f"thread {tid} blocks {sig.name}: a fault there would hang"
        main = next(t for t in _tasks() if t[0] == threading.main_thread().native_id)
        assert not _blocked(main[2], signal.SIGINT), "the caller's signal mask must come back after Spawn"
    finally:
        p.close()


def test_transfers_over_tcp_succeed_under_a_signal_storm():
    """SIGALRM every millisecond (an interval timer) and SIGUSR1 from another thread, both with Python
    handlers, while the main thread and two more pull and push 8 MiB at a time over TCP."""
    hits = {signal.SIGALRM: 0, signal.SIGUSR1: 0}

    def handler(sig, _frame):
        hits[sig] += 1

    p = _mix_pair()
    old = {s: signal.signal(s, handler) for s in hits}
    stop = threading.Event()
    errors = []
    try:
        desc = kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB])
        src = p.p.allocate_cache(desc)
        for t in range(TENSORS):
            src.numpy(t)[:] = pattern(1, t, BLOCKS, BB)
        want = [pattern(1, t, BLOCKS, BB) for t in range(TENSORS)]
        blocks = list(range(BLOCKS))
        backs = [p.p.allocate_cache(desc) for _ in range(3)]  # one push destination per thread
        _link(p)

        def rounds(n, back):
            dst = p.d.allocate_cache(desc)
            for _ in range(n):
                for t in range(TENSORS):
                    dst.numpy(t)[:] = 0
                p.d.pull_kv_blocks(kb.CacheIndex(1, src.cache_id), dst, blocks, blocks)
                for t in range(TENSORS):
                    assert np.array_equal(dst.numpy(t), want[t]), f"tensor {t} differs after a pull"
                for t in range(TENSORS):
                    back.numpy(t)[:] = 0
                p.d.push_kv_blocks(dst, kb.CacheIndex(1, back.cache_id), blocks, blocks)
                for t in range(TENSORS):
                    assert np.array_equal(back.numpy(t), want[t]), f"tensor {t} differs after a push"

        def worker(back):
            try:
                rounds(5, back)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        def storm():
            while not stop.is_set():
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(0.0005)

        stormer = threading.Thread(target=storm)
        workers = [threading.Thread(target=worker, args=(b,)) for b in backs[1:]]
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        stormer.start()
        for w in workers:
            w.start()
        rounds(10, backs[0])  # on the main thread, where the handlers run and its system calls see EINTR
        for w in workers:
            w.join(60)
        assert not errors, errors
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        stop.set()
        for s, h in old.items():
            signal.signal(s, h)
        p.close()
    assert hits[signal.SIGALRM] > 0 and hits[signal.SIGUSR1] > 0, hits
