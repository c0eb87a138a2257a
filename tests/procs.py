# SPDX-License-Identifier: Apache-2.0
"""Helpers to start tests/peer.py as a real second process and talk to it."""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")


class Peer:
    """A kvblocks process (tests/peer.py) driven over its stdin/stdout."""

    def __init__(self, cluster, listen="", transport="auto", tensors=4, blocks=8, block_bytes=64, wait_ms=1000,
                 auth=None, prefix=(), role="MIX"):
        cmd = list(prefix) + [sys.executable, PEER, "--cluster", str(cluster), "--transport", transport,
                              "--tensors", str(tensors), "--blocks", str(blocks), "--block-bytes", str(block_bytes),
                              "--wait-ms", str(wait_ms), "--role", role]
        if listen:
            cmd += ["--listen", listen]
        if auth is not None:
            cmd += ["--auth", auth]
        env = dict(os.environ)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("peer failed to start: " + self.proc.stderr.read())
        self.info = json.loads(line)
        self.stderr_text = ""
        self.cluster, self.tensors, self.blocks, self.block_bytes = cluster, tensors, blocks, block_bytes

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("peer died: " + self.proc.stderr.read())
        return json.loads(line)

    def digest(self):
        return self.call(op="digest")["digest"]

    def read(self, cache, tensor):
        return np.frombuffer(bytes.fromhex(self.call(op="read", cache=cache, tensor=tensor)["hex"]), dtype=np.uint8)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        if not self.proc.stderr.closed:
            self.stderr_text = self.proc.stderr.read()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass


def read_process_memory(pid: int, addr: int, n: int) -> bytes:
    """Reads another process's memory through /proc (works while it is SIGSTOPped)."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
        f.seek(addr)
        return f.read(n)
