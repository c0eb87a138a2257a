# SPDX-License-Identifier: Apache-2.0
"""Transfers in flight, finished through the runtime's async handles (``*_async`` / ``*_batch``).

The runtime's own thread pool moves the bytes and completes the handle; the engine's step calls
:meth:`Transfers.poll` (microseconds: ``done()`` reads a flag) and gets what finished since, each with
its status, seconds since submission and the caller's context. No Python thread waits on a transfer.
"""
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Generic, Hashable, List, Optional, Tuple, TypeVar

import kvblocks as kb

C = TypeVar("C")


@dataclass
class Finished(Generic[C]):
    key: Hashable
    context: C
    ok: bool
    seconds: float
    error: Optional[str] = None  # the runtime's status name and message when not ok


class Transfers(Generic[C]):
    """Handles in flight keyed by the caller (a request id, say). Thread-safe: any thread may
    :meth:`add`; one thread polls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Dict[Hashable, Tuple["kb.TransferHandle", C, float]] = {}

    def add(self, key: Hashable, handle: "kb.TransferHandle", context: C, t0: Optional[float] = None) -> None:
        with self._lock:
            if key in self._pending:
                raise ValueError(f"transfer {key!r} is already in flight")
            self._pending[key] = (handle, context, time.perf_counter() if t0 is None else t0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def poll(self) -> List[Finished[C]]:
        """Transfers that finished since the last call (successfully or not)."""
        with self._lock:
            done = [(k, v) for k, v in self._pending.items() if v[0].done()]
            for k, _ in done:
                del self._pending[k]
        return [_finish(k, h, c, t0) for k, (h, c, t0) in done]

    def wait_all(self, timeout: float) -> List[Finished[C]]:
        """Poll until nothing is in flight or ``timeout`` s passed (shutdown, tests)."""
        end = time.monotonic() + timeout
        out = self.poll()
        while len(self) and time.monotonic() < end:
            time.sleep(0.001)
            out += self.poll()
        return out


def _finish(key: Hashable, h: "kb.TransferHandle", ctx: Any, t0: float) -> Finished:
    took = time.perf_counter() - t0
    try:
        h.wait(0)  # done: returns None or raises the transfer's error at once
    except kb.LLMException as e:
        return Finished(key, ctx, False, took, f"{type(e).__name__}: {e}")
    return Finished(key, ctx, True, took)
