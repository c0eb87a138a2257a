# SPDX-License-Identifier: Apache-2.0
"""A peer engine measured in turns beside the kvblocks case it is compared with.

The engine's initiator runs in its own process and serves one op at a time over a Pipe:
``case`` (set up a size/direction/pattern), ``calibrate`` (warm up), ``turn`` (time m samples),
``verify`` (one checked call), ``quit``. This process drives the rounds: a turn of the kvblocks
case, of its baseline, then of each engine, so they see the same load. While one side runs the
others wait on a Pipe, not on a CPU; the engine's target is even stopped (SIGSTOP) outside its
own turns, because NIXL's progress thread there spins a whole core while idle.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal

from .common import SIZES
from .common import np as _np
from .engines import driver, engine_env
from .markers import check_blocks, id_lists, mark_blocks
from .timing import LocalSide


def _quiet_stderr():
    """Engines log to fd 2 from C++ (glog, UCX); their errors reach us through the pipe instead."""
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)


def _engine_target(conn, engine):
    """The remote side: exposes arrays of the requested shape, marks and checks blocks."""
    os.environ.update(engine_env(engine))
    _quiet_stderr()
    drv = driver(engine, "target", False)
    arrays = None
    while True:
        op, *args = conn.recv()
        try:
            if op == "alloc":
                if arrays is not None:
                    drv.unexpose()
                nt, nb, bb = args
                arrays = [_np().full((nb, bb), 0x5A, dtype=_np().uint8) for _ in range(nt)]
                conn.send(("ok", drv.expose(arrays)))
            elif op == "mark":
                mark_blocks(arrays, *args)
                conn.send(("ok", None))
            elif op == "check":
                conn.send(("ok", check_blocks(arrays, *args)))
            elif op == "quit":
                conn.send(("ok", None))
                break
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
    os._exit(0)  # engine teardown at interpreter exit has crashed in the past (peers.md)


class _Target:
    """The target process, seen from the initiator."""

    def __init__(self, engine):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_target, args=(child, engine))
        self.proc.start()

    def call(self, *msg):
        self.conn.send(msg)
        if not self.conn.poll(300):
            raise RuntimeError("engine target did not answer")
        st, val = self.conn.recv()
        if st != "ok":
            raise RuntimeError(val)
        return val

    def close(self):
        try:
            os.kill(self.proc.pid, signal.SIGCONT)  # it may have been left stopped by EngineSide
            self.call("quit")
        except Exception:
            pass
        self.proc.join(10)


class _Initiator:
    """The initiator's state, one method per Pipe op."""

    def __init__(self, engine, target):
        self.drv, self.target = driver(engine, "initiator", True), target
        self.size = self.arrays = self.side = None

    def _expose(self, size):
        L, nb, bb, _ = SIZES[size]
        if self.size is not None:
            self.size = None
            self.drv.unprepare()
            self.drv.unexpose()
        self.arrays = [_np().full((nb, bb), 0x5A, dtype=_np().uint8) for _ in range(2 * L)]
        self.drv.expose(self.arrays)
        self.drv.prepare(self.arrays, self.target.call("alloc", 2 * L, nb, bb), nb, bb)
        self.size = size

    def case(self, size, direction, pattern):
        if self.size != size:
            self._expose(size)
        L, nb, bb, B = SIZES[size]
        np = _np()
        self.rng = np.random.default_rng(11)
        it = itertools.cycle([(s.astype(np.int32), d.astype(np.int32))
                              for s, d in id_lists(self.rng, nb, B, pattern, 64)])
        op, drv = ("READ" if direction == "pull" else "WRITE"), self.drv
        if direction == "pull":
            def fn():
                s, d = next(it)
                drv.xfer(op, d, s)
        else:
            def fn():
                s, d = next(it)
                drv.xfer(op, s, d)
        self.side, self.spec = LocalSide(fn), (nb, B, direction, pattern, op)
        return {"bytes": 2 * L * B * bb, "blocks": 2 * L * B}

    def calibrate(self, n):
        return self.side.calibrate(n)

    def turn(self, batch, m):
        return self.side.turn(batch, m)

    def verify(self):
        nb, B, direction, pattern, op = self.spec
        s, d = [x.astype(_np().int32) for x in id_lists(self.rng, nb, B, pattern, 1)[0]]
        nonce = 999
        if direction == "pull":
            self.target.call("mark", s, nonce)
            self.drv.xfer(op, d, s)
            return check_blocks(self.arrays, d, s, nonce)
        mark_blocks(self.arrays, s, nonce)
        self.drv.xfer(op, s, d)
        return self.target.call("check", d, s, nonce)


_INITIATOR_OPS = ("case", "calibrate", "turn", "verify")


def _engine_initiator(conn, engine):
    """Serves the ops of :class:`EngineSide` until ``quit`` or the Pipe closes."""
    os.environ.update(engine_env(engine))
    _quiet_stderr()
    target = _Target(engine)
    try:
        state = _Initiator(engine, target)
        conn.send(("ok", target.proc.pid))
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        state = None
    while state is not None:
        try:
            op, *args = conn.recv()
        except EOFError:
            break
        if op not in _INITIATOR_OPS:
            break
        try:
            conn.send(("ok", getattr(state, op)(*args)))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
    target.close()
    os._exit(0)


class EngineSide:
    """A peer engine's initiator process, measured as a side of :func:`.timing.measure_interleaved`.

    A failure inside a turn is recorded in ``error`` (the engine's row reports it) instead of
    raised, so the kvblocks case measured beside it carries on; a dead process stays ``dead``.
    """

    fast = False  # engine calls are timed one per sample, as they always were

    def __init__(self, engine, timeout=300):
        """Starts the engine's processes; a failure is kept in ``dead``. Raises nothing."""
        self.engine, self.timeout = engine, timeout
        self.error = self.dead = self.target_pid = None
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_initiator, args=(child, engine))
        self.proc.start()
        child.close()
        try:
            self.target_pid = self._call()
            self._signal(signal.SIGSTOP)
        except RuntimeError as e:
            self.dead = str(e)

    def _signal(self, sig):
        if self.target_pid is not None:
            try:
                os.kill(self.target_pid, sig)
            except ProcessLookupError:
                pass

    def _call(self, *msg):
        self._signal(signal.SIGCONT)
        try:
            return self._exchange(msg)
        finally:
            self._signal(signal.SIGSTOP)

    def _exchange(self, msg):
        try:
            if msg:
                self.conn.send(msg)
            if not self.conn.poll(self.timeout):
                self.dead = f"engine did not answer {msg[:1]} within {self.timeout}s"
                raise RuntimeError(self.dead)
            st, val = self.conn.recv()
        except (EOFError, OSError) as e:
            self.dead = f"engine process died ({type(e).__name__})"
            raise RuntimeError(self.dead) from None
        if st != "ok":
            raise RuntimeError(val)
        return val

    def start(self, size, direction, pattern):
        """Sets up one case on the engine; returns {"bytes", "blocks"} per call.

        Raises:
            RuntimeError: the engine failed or is dead.
        """
        self.error = None
        if self.dead:
            raise RuntimeError(self.dead)
        return self._call("case", size, direction, pattern)

    def calibrate(self, n):
        """The engine's warm-up; seconds per call, or 1 s after a failure. Raises nothing."""
        try:
            return self._call("calibrate", n)
        except RuntimeError as e:
            self.error = str(e)
            return 1.0

    def turn(self, batch, m):
        """``m`` samples from the engine, or [] once it failed in this case. Raises nothing."""
        if self.error:
            return []
        try:
            return self._call("turn", batch, m)
        except RuntimeError as e:
            self.error = str(e)
            return []

    def verify(self):
        """Bad blocks after one checked call.

        Raises:
            RuntimeError: the engine failed or is dead.
        """
        return self._call("verify")

    def close(self):
        """Stops the engine's processes. Raises nothing."""
        self._signal(signal.SIGCONT)
        try:
            self.conn.send(("quit",))
        except (OSError, ValueError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()
