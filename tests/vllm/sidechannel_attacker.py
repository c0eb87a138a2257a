# SPDX-License-Identifier: Apache-2.0
"""Side-channel attackers, each in its own process (driven by test_vllm_sidechannel.py).

Usage: ``python sidechannel_attacker.py MODE JSON_ARGS``. The attacker prints JSON lines on stdout: first
``{"ready": ...}`` (with the port it listens on, where it listens), then one ``{"result": ...}``.

Modes:

* ``fake-prefill {engine_id, wait_s}``: a prefill without the token. Greets like a prefill (its nonce,
  the engine id it pretends to be), says ok to any proof, answers ok to every later line, and reports the
  lines it got after the proof (what a decode it fooled would have told it).
* ``relay {prefill_port, victim, wait_s}``: a man in the middle without the token. A decode dialing it
  gets the real prefill's greeting, the prefill gets the decode's proof, and the prefill's answer goes
  back; when the prefill took the proof the relay sends ``done`` for the victim request on that connection.
* ``other-decode {prefill_port, token, engine_id, prefill_engine, victim}``: a decode holding the token,
  not the one the victim request was handed to: claims it and says done for it; reports both answers.
* ``idle {port, n, hold_s}``: opens ``n`` connections and never authenticates; reports how many the
  server closed within ``hold_s``.
* ``done-flood {port, token, engine_id, prefill_engine, n, id_len}``: a token holder saying done for
  ``n`` distinct request ids of ``id_len`` characters; reports how many were accepted and refused.
* ``deep-json {port, token, engine_id, prefill_engine, depth}``: sends ``[`` * depth as the first line,
  then (authenticated, correctly sealed) as a message; reports whether the server closed each connection.
"""
import hashlib
import hmac
import json
import os
import socket
import sys
import time

from kvblocks.vllm._sidechannel import SideChannelClient  # the test's kvblocks (it sets PYTHONPATH)


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def listener():
    s = socket.create_server(("127.0.0.1", 0))
    return s, s.getsockname()[1]


def line_of(f):
    return f.readline(1 << 20)


def fake_prefill(a):
    srv, port = listener()
    say({"ready": True, "port": port})
    srv.settimeout(a["wait_s"])
    got = []
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        return {"connected": False, "got": got}
    conn.settimeout(a["wait_s"])
    f = conn.makefile("rwb")
    nonce = os.urandom(16).hex()
    f.write(json.dumps({"proto": "kvblocks-vllm/2", "nonce": nonce, "engine_id": a["engine_id"]}).encode() + b"\n")
    f.flush()
    try:
        proof = line_of(f)
        f.write(json.dumps({"ok": True, "mac": "0" * 64}).encode() + b"\n")  # it cannot make the real one
        f.flush()
        while True:
            ln = line_of(f)
            if not ln:
                break
            got.append(ln.decode(errors="replace").strip())
            f.write(b'{"ok":true}\n')
            f.flush()
    except OSError:
        pass
    return {"connected": True, "proof_seen": bool(proof), "got": got}


def relay(a):
    srv, port = listener()
    say({"ready": True, "port": port})
    srv.settimeout(a["wait_s"])
    dec, _ = srv.accept()
    dec.settimeout(a["wait_s"])
    pre = socket.create_connection(("127.0.0.1", a["prefill_port"]), timeout=a["wait_s"])
    df, pf = dec.makefile("rwb"), pre.makefile("rwb")
    out = {"relayed": []}
    for src, dst in ((pf, df), (df, pf), (pf, df)):  # greeting, proof, the prefill's answer
        ln = line_of(src)
        out["relayed"].append(ln.decode(errors="replace").strip()[:200])
        if not ln:
            return out
        dst.write(ln)
        dst.flush()
    if json.loads(out["relayed"][-1]).get("ok"):
        pf.write(json.dumps({"op": "done", "req": a["victim"]}).encode() + b"\n")
        pf.flush()
        ans = line_of(pf).decode(errors="replace").strip()
        out["injected_done_answer"] = ans
    return out


def client(a):
    return SideChannelClient("127.0.0.1", a["port"], a.get("token"), timeout_s=10, engine_id=a["engine_id"],
                             peer_engine=a["prefill_engine"])


def answer(c, msg):
    try:
        return c.call(msg)
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        return {"error": f"{type(e).__name__}: {e}"}


def other_decode(a):
    say({"ready": True})
    c = client(a)
    return {"claim": answer(c, {"op": "claim", "req": a["victim"]}),
            "done": answer(c, {"op": "done", "req": a["victim"]})}


def idle(a):
    socks = []
    for _ in range(a["n"]):
        s = socket.create_connection(("127.0.0.1", a["port"]), timeout=30)
        socks.append(s)
    say({"ready": True, "opened": len(socks)})
    for s in socks:
        s.setblocking(False)
    closed, first_all = set(), None
    t0 = time.monotonic()
    while time.monotonic() - t0 < a["hold_s"]:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                while True:
                    d = s.recv(4096)
                    if not d:
                        closed.add(i)
                        break
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed.add(i)
        if len(closed) == len(socks) and first_all is None:
            first_all = time.monotonic() - t0
            break
        time.sleep(0.05)
    return {"opened": len(socks), "closed": len(closed), "all_closed_after_s": first_all}


def done_flood(a):
    say({"ready": True})
    c = client(a)
    ok = refused = 0
    for i in range(a["n"]):
        rid = (f"flood-{i}-" + "x" * a["id_len"])[:a["id_len"]]
        ans = answer(c, {"op": "done", "req": rid})
        if ans.get("ok"):
            ok += 1
        else:
            refused += 1
    return {"ok": ok, "refused": refused, "last": ans}


def closed_after(sock, f, line):
    """Sends ``line``; True when the server then closes the connection (reads answers until EOF)."""
    sock.settimeout(10)
    f.write(line)
    f.flush()
    try:
        while True:
            if not f.readline(1 << 20):
                return True
    except OSError:
        return False


def deep_json(a):
    say({"ready": True})
    deep = b"[" * a["depth"] + b"\n"
    s = socket.create_connection(("127.0.0.1", a["port"]), timeout=10)
    f = s.makefile("rwb")
    f.readline(1 << 20)  # greeting
    first = closed_after(s, f, deep)
    c = client(a)
    c.call({"op": "hello"})  # authenticated now; seal the deep line as the next message
    ses = c._session
    body = deep.rstrip(b"\n")
    mac = hmac.new(ses.key, b"%s:%d:" % (ses.out_dir.encode(), ses.seq_out) + body, hashlib.sha256).hexdigest()
    second = closed_after(c._conn, c._f, mac.encode() + b" " + body + b"\n")
    return {"closed_unauthenticated": first, "closed_authenticated": second}


MODES = {"fake-prefill": fake_prefill, "relay": relay, "other-decode": other_decode, "idle": idle,
         "done-flood": done_flood, "deep-json": deep_json}

if __name__ == "__main__":
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        result = MODES[mode](args)
    except Exception as e:  # noqa: BLE001 - report, the test decides
        result = {"exception": f"{type(e).__name__}: {e}"}
    say({"result": result})
