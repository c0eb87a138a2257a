# SPDX-License-Identifier: Apache-2.0
"""Loopback ports for test listeners, picked outside the kernel's ephemeral range.

A port from ``bind(0)`` is free only until the next outgoing connection or ``bind(0)``
anywhere on the machine takes it (vLLM, torch and zmq start many); a port below the
ephemeral range is handed out only by an explicit bind, so it stays free until used.
"""
import random
import socket

_FLOOR = 10000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A loopback port p such that p..p+span-1 are free now and below the ephemeral range.

    Raises:
        RuntimeError: no such range was found in 500 tries.
    """
    high = _ephemeral_low() - span
    for _ in range(500):
        p = random.randrange(_FLOOR, high)
        if all(_bindable(q) for q in range(p, p + span)):
            return p
    raise RuntimeError("no free port range below the ephemeral range")
