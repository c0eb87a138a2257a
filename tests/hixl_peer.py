# SPDX-License-Identifier: Apache-2.0
"""A hixl server engine in its own process, driven over stdin/stdout (one JSON object a line), for
the cross-process tests of kvblocks.hixl.

    python hixl_peer.py NAME SIZE FILL

Registers a SIZE-byte host buffer filled with FILL as MEM_DEVICE, prints {"addr", "pid"}, then
answers commands: digest(off, len), register(size, fill), watch(count), exit. `watch` polls
get_notifies until `count` notifications arrived and, at each arrival, checks the buffer range the
message names ("off:len:byte"), so a notification that overtakes its data is seen."""
import ctypes
import hashlib
import json
import sys
import time

import kvblocks.hixl as hx


def main():
    name, size, fill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    eng = hx.Hixl()
    st = eng.initialize(name)
    if st != hx.SUCCESS:
        raise SystemExit(f"initialize({name}) = {st}")
    keep = []

    def region(n, byte):
        b = (ctypes.c_uint8 * n)()
        ctypes.memset(b, byte, n)
        st, _ = eng.register_mem(hx.MemDesc(ctypes.addressof(b), n), hx.MEM_DEVICE)
        if st != hx.SUCCESS:
            raise SystemExit(f"register_mem = {st}")
        keep.append(b)
        return ctypes.addressof(b)

    base = region(size, fill)
    out = sys.stdout
    out.write(json.dumps({"addr": base, "pid": __import__("os").getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "digest":
            data = ctypes.string_at(cmd["addr"], cmd["len"])
            reply = {"sha": hashlib.sha256(data).hexdigest()}
        elif op == "register":
            reply = {"addr": region(cmd["size"], cmd["fill"])}
        elif op == "watch":
            checks, deadline = [], time.monotonic() + cmd.get("timeout", 30)
            while len(checks) < cmd["count"] and time.monotonic() < deadline:
                st, got = eng.get_notifies()
                for n in got:
                    off, ln, byte = (int(x) for x in n.notify_msg.split(":"))
                    checks.append(ctypes.string_at(base + off, ln) == bytes([byte]) * ln)
                time.sleep(0.0005)
            reply = {"checks": checks}
        elif op == "exit":
            break
        else:
            reply = {"error": f"unknown op {op}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    eng.finalize()


if __name__ == "__main__":
    main()
