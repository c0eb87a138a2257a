# SPDX-License-Identifier: Apache-2.0
"""Peer engines (NIXL, Mooncake Transfer Engine): drivers and their availability.

Each engine runs in processes of its own (an initiator and a target, see :mod:`.engine_side`): their
imports can crash, need environment set before they load, and log from C++ to fd 2.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from .common import UCX_TLS
from .common import np as _np

ENGINES = ("nixl", "nixl-tcp", "mooncake")
# kvblocks paths each engine variant is compared with
ENGINE_PATHS = {"nixl": ("shm", "cma"), "nixl-tcp": ("tcp", "ucx"), "mooncake": ("tcp",)}


def variants(name):
    """The engine variants ``--vs name`` runs: nixl -> nixl (UCX picks CMA) and nixl-tcp.
    Raises nothing."""
    return ("nixl", "nixl-tcp") if name == "nixl" else (name,)


def engine_env(engine):
    """Environment the engine's processes set before importing it. Raises nothing."""
    env = {"UCX_MODULES": "^ib", "NIXL_LOG_LEVEL": "WARN", "GLOG_minloglevel": "2",
           "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "16384"}
    if engine == "nixl-tcp":
        env["UCX_TLS"] = UCX_TLS  # the set kvblocks' UCX cases use ("tcp" unless KVBLOCKS_BENCH_UCX_TLS)
    return env


def engine_available(engine):
    """(True, "") or (False, why), probed in a child process (imports can crash or pollute).

    Raises:
        KeyError: unknown engine.
        OSError: the child interpreter could not be started.
    """
    has_cu12 = importlib.util.find_spec("nixl_cu12") is not None
    code = {"nixl": "import nixl_cu12._api" if has_cu12 else "import nixl._api",
            "mooncake": "from mooncake.engine import TransferEngine"}[engine.split("-")[0]]
    env = dict(os.environ, **engine_env(engine))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return True, ""


class NixlDriver:
    """NIXL agent with the UCX backend on DRAM."""

    def __init__(self, name, initiator):
        """Raises: ImportError (no NIXL), RuntimeError or nixl errors (agent creation failed)."""
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError:
            from nixl._api import nixl_agent, nixl_agent_config
        # the initiator polls itself (the faster setting on 2 cores, see peers.md); the target
        # keeps its progress thread because it never polls
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=not initiator, backends=["UCX"]))
        self.regs = []

    def expose(self, arrays):
        """Registers ``arrays``; returns what the other side needs to reach them. Raises: nixl errors."""
        self.regs.append(self.agent.register_memory([(a.ctypes.data, a.nbytes, 0, "") for a in arrays], "DRAM"))
        return {"md": self.agent.get_agent_metadata(), "addrs": [a.ctypes.data for a in arrays]}

    def prepare(self, arrays, info, nb, bb):
        """Adds the remote agent and prepares per-block descriptor lists. Raises: nixl errors."""
        np = _np()
        self.remote = self.agent.add_remote_agent(info["md"])

        def descs(addrs):
            d = np.empty((len(addrs) * nb, 3), dtype=np.uint64)
            for t, base in enumerate(addrs):
                d[t * nb:(t + 1) * nb, 0] = base + np.arange(nb, dtype=np.uint64) * np.uint64(bb)
            d[:, 1] = bb
            d[:, 2] = 0
            return d
        self.lh = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs([a.ctypes.data for a in arrays]), "DRAM")
        self.rh = self.agent.prep_xfer_dlist(self.remote, descs(info["addrs"]), "DRAM")
        self.off = (np.arange(len(arrays), dtype=np.int32) * nb)[:, None]
        try:
            self.agent.make_connection(self.remote)
        except Exception:  # older NIXL connects on the first transfer instead
            pass

    def xfer(self, op, local_ids, remote_ids):
        """One READ or WRITE of the given blocks of every tensor, polled to completion.

        Raises:
            RuntimeError: the transfer did not end in state DONE.
        """
        li = (self.off + local_ids[None, :]).ravel()
        ri = (self.off + remote_ids[None, :]).ravel()
        h = self.agent.make_prepped_xfer(op, self.lh, li, self.rh, ri, b"")
        st = self.agent.transfer(h)
        while st == "PROC":
            st = self.agent.check_xfer_state(h)
        h.release()
        if st != "DONE":
            raise RuntimeError(f"nixl transfer state {st}")

    def unprepare(self):
        """Releases the descriptor lists and the remote agent. Raises: nixl errors."""
        self.lh.release()
        self.rh.release()
        self.agent.remove_remote_agent(self.remote)

    def unexpose(self):
        """Deregisters everything exposed. Raises: nixl errors."""
        for r in self.regs:
            self.agent.deregister_memory(r)
        self.regs = []


class MooncakeDriver:
    """Mooncake TransferEngine, ``tcp`` protocol, P2P handshake."""

    def __init__(self, name, initiator):
        """Raises: ImportError (no Mooncake), RuntimeError (initialize failed)."""
        from mooncake.engine import TransferEngine

        self.e = TransferEngine()
        if self.e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("mooncake initialize failed")
        self.bufs = []

    def expose(self, arrays):
        """Registers ``arrays``; returns the session and addresses. Raises: RuntimeError."""
        addrs = [a.ctypes.data for a in arrays]
        if self.e.batch_register_memory(addrs, [a.nbytes for a in arrays]) != 0:
            raise RuntimeError("mooncake register failed")
        self.bufs.append(addrs)
        return {"session": "127.0.0.1:%d" % self.e.get_rpc_port(), "addrs": addrs}

    def prepare(self, arrays, info, nb, bb):
        """Keeps the base addresses for address arithmetic. Raises nothing."""
        np = _np()
        self.session = info["session"]
        self.la = np.array([a.ctypes.data for a in arrays], dtype=np.uint64)[:, None]
        self.ra = np.array(info["addrs"], dtype=np.uint64)[:, None]
        self.bb = np.uint64(bb)

    def xfer(self, op, local_ids, remote_ids):
        """One synchronous batch read or write of the given blocks of every tensor.

        Raises:
            RuntimeError: the engine returned non-zero.
        """
        np = _np()
        loc = (self.la + local_ids.astype(np.uint64)[None, :] * self.bb).ravel().tolist()
        rem = (self.ra + remote_ids.astype(np.uint64)[None, :] * self.bb).ravel().tolist()
        lens = [int(self.bb)] * len(loc)
        f = self.e.batch_transfer_sync_read if op == "READ" else self.e.batch_transfer_sync_write
        rc = f(self.session, loc, rem, lens)
        if rc != 0:
            raise RuntimeError(f"mooncake transfer rc {rc}")

    def unprepare(self):
        """Nothing to release. Raises nothing."""

    def unexpose(self):
        """Unregisters everything exposed. Raises nothing the engine does not."""
        for addrs in self.bufs:
            self.e.batch_unregister_memory(addrs)
        self.bufs = []


def driver(engine, name, initiator):
    """A driver for ``engine`` (nixl, nixl-tcp or mooncake).

    Raises:
        ImportError, RuntimeError: as the driver's constructor.
    """
    return (MooncakeDriver if engine == "mooncake" else NixlDriver)(name, initiator)
