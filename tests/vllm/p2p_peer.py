# SPDX-License-Identifier: Apache-2.0
"""Second processes with a KvblocksTransport (vLLM's P2P DataTransport), forked from one zygote.

Importing vLLM costs 5-20 s on this machine, so this process imports it once, then forks a fresh
process per peer the test asks for (one JSON line on stdin each: the child's FIFOs and arguments). A
child makes its own kvblocks engine (none exists in the zygote) and is driven by JSON lines over its
FIFOs. Its block region is a shared file mapping the test maps too, so the test reads the peer's memory
directly, even while the peer is stopped (SIGSTOP) or dead. A second mapping, never registered, is a
canary: an address a hostile control plane could name.
"""
import ctypes
import json
import mmap
import os
import signal
import sys
import time

from kvblocks.vllm.p2p_tier import KvblocksTransport


def _map(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _serve(t: KvblocksTransport, cmd_in, out) -> None:
    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in cmd_in:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "add_peer":
                t.add_remote_peer(cmd["peer_id"], bytes.fromhex(cmd["meta"]), cmd["base_addr"], cmd["num_blocks"],
                                  cmd["block_len"])
                reply({"ok": True})
            elif op == "write_and_poll":  # one write, polled to its end as vLLM's session does
                tid = t.write_blocks(cmd["peer_id"], cmd["local"], cmd["remote"])
                res = None
                deadline = time.monotonic() + 10
                while tid is not None and res is None and time.monotonic() < deadline:
                    r = t.poll(cmd["peer_id"])
                    res = "done" if tid in r.done else "failed" if tid in r.failed else None
                    time.sleep(0.001)
                reply({"tid": tid, "result": res})
            elif op == "quit":
                t.close()
                reply({"ok": True})
                return
        except ValueError as e:
            reply({"error": f"{type(e).__name__}: {e}"})


def child(req: dict) -> None:
    nb, bl = req["num_blocks"], req["block_len"]
    cmd_in = open(req["cmd_fifo"])
    out = open(req["reply_fifo"], "w")
    region = _map(req["region"], nb * bl)
    canary = _map(req["canary"], bl)
    view = memoryview(region).cast("B", (nb, bl))
    t = KvblocksTransport(view, {"model": "tiny"}, auth_token=req["token"], transport=req["transport"],
                          timeout_ms=req["timeout_ms"])
    out.write(json.dumps({"meta": t.get_agent_metadata().hex(), "base_addr": t.base_addr, "num_blocks": t.num_blocks,
                          "block_len": t.block_len, "pid": os.getpid(),
                          "canary_addr": ctypes.addressof(ctypes.c_char.from_buffer(canary))}) + "\n")
    out.flush()
    _serve(t, cmd_in, out)


def main() -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if os.fork() == 0:
            try:
                child(req)
            finally:
                os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
