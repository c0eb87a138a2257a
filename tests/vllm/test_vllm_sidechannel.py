# SPDX-License-Identifier: Apache-2.0
"""The vLLM connector's side channel against attackers in real second processes (no vLLM needed).

The prefill's server runs here with its real request bookkeeping (``Handoffs``); each attacker is
``sidechannel_attacker.py`` in its own process: a prefill without the token, a relay between a decode
and the real prefill, a decode holding the token that was not handed the request, idle sockets, a flood
of "done" ids, deeply nested JSON.
"""
import json
import os
import selectors
import subprocess
import sys
import threading
import time

import pytest

import kvblocks
from kvblocks.vllm._sidechannel import AUTH_TIMEOUT_S, Handoffs, SideChannelClient, SideChannelServer, parse

pytestmark = pytest.mark.vllm

HERE = os.path.dirname(os.path.abspath(__file__))
ATTACKER = os.path.join(HERE, "sidechannel_attacker.py")
KVBLOCKS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kvblocks.__file__)))  # the same kvblocks there
TOKEN = "s3cret"
PREFILL = "prefill-engine-0"
MiB = 1 << 20


class Attacker:
    """``sidechannel_attacker.py MODE`` in its own process; ``ready`` is its first line."""

    def __init__(self, mode: str, **args):
        env = dict(os.environ, PYTHONPATH=KVBLOCKS_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, ATTACKER, mode, json.dumps(args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd="/")
        self.ready = self._line(60)

    def _line(self, timeout: float):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            self.proc.kill()
            raise TimeoutError(f"attacker silent for {timeout} s: {self.proc.stderr.read()}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"attacker exited ({self.proc.wait()}): {self.proc.stderr.read()}")
        return json.loads(line)

    def result(self, timeout: float = 120):
        try:
            return self._line(timeout)["result"]
        finally:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _prefill(handoffs=None, token=TOKEN, **kw):
    h = handoffs if handoffs is not None else Handoffs(retention_s=60)
    return SideChannelServer("127.0.0.1", 0, PREFILL, lambda: {"cache_id": 1}, h, token, **kw), h


def _decode(port, engine="decode-1", token=TOKEN, peer=PREFILL):
    return SideChannelClient("127.0.0.1", port, token, timeout_s=5, engine_id=engine, peer_engine=peer)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_decode_tells_nothing_to_a_prefill_without_the_token():
    """A decode pointed at an attacker's notify_port: the attacker cannot prove the token, so the decode
    sends nothing after its (useless elsewhere) proof: no hello, no claim, no done."""
    atk = Attacker("fake-prefill", engine_id=PREFILL, wait_s=15)
    d = _decode(atk.ready["port"])
    try:
        with pytest.raises((ConnectionError, OSError, ValueError), match="prove|refused|closed"):
            d.call({"op": "done", "req": "r1"})
    finally:
        d.close()
    res = atk.result()
    assert res["connected"] and res["got"] == [], res


def test_relayed_proof_frees_nothing():
    """A relay without the token between a decode and the real prefill: the decode's proof is bound to the
    address it dialed (the relay's), so the prefill refuses it and the relay's "done" for another request
    never lands; that request stays held and claimable by the decode it is handed to."""
    srv, h = _prefill()
    h.hold("victim", 60)
    atk = Attacker("relay", prefill_port=srv.port, victim="victim", wait_s=15)
    d = _decode(atk.ready["port"], engine="decode-2")
    try:
        with pytest.raises((ConnectionError, OSError, ValueError)):
            d.call({"op": "done", "req": "mine"})
        res = atk.result()
        assert "injected_done_answer" not in res, res
        released, expired = h.finished()
        assert "victim" not in released | expired
        legit = _decode(srv.port, engine="decode-1")
        legit.call({"op": "claim", "req": "victim"})  # still held: its decode claims and pulls it
        legit.close()
    finally:
        d.close()
        srv.close()


def test_done_from_a_decode_the_request_was_not_handed_to_is_refused():
    srv, h = _prefill()
    h.hold("victim", 60)
    legit = _decode(srv.port, engine="decode-1")
    try:
        legit.call({"op": "claim", "req": "victim"})  # decode-1 is about to pull it
        atk = Attacker("other-decode", port=srv.port, token=TOKEN, engine_id="decode-2", prefill_engine=PREFILL,
                       victim="victim")
        res = atk.result()
        assert "another decode" in res["claim"].get("error", ""), res
        assert "another decode" in res["done"].get("error", ""), res
        assert h.finished() == (set(), set())  # nothing freed under decode-1's pull
        legit.call({"op": "done", "req": "victim"})
        assert h.finished() == ({"victim"}, set())
    finally:
        legit.close()
        srv.close()


def test_idle_sockets_hold_no_threads_and_are_closed():
    """300 connections that never authenticate: no thread each, little memory; each is closed within the
    auth timeout (most at once: at most max_conns wait), and a real decode is served meanwhile."""
    srv, _ = _prefill()
    threads0, rss0 = _threads(), _rss()
    try:
        atk = Attacker("idle", port=srv.port, n=300, hold_s=20)
        assert atk.ready["opened"] == 300
        time.sleep(0.5)  # (main started a thread per socket: let them all start)
        threads1, rss1 = _threads(), _rss()
        t0 = time.monotonic()
        d = _decode(srv.port)
        assert d.call({"op": "hello"})["cache_id"] == 1
        served_s = time.monotonic() - t0
        d.close()
        res = atk.result()
    finally:
        srv.close()
    print(f"\n300 idle sockets: threads {threads0} -> {threads1}, RSS +{(rss1 - rss0) / MiB:.1f} MiB, "
          f"all closed after {res['all_closed_after_s']} s, a real decode served in {served_s:.3f} s")
    assert threads1 - threads0 < 10, (threads0, threads1)  # (slack for threads of other tests ending)
    assert rss1 - rss0 < 16 * MiB
    assert res["closed"] == 300 and res["all_closed_after_s"] < AUTH_TIMEOUT_S + 3, res
    assert served_s < 1.0


def test_done_ids_bounded_in_length_count_and_memory():
    """A token holder says done for 2,000 ids of 60,000 characters, then 5,000 short ones: the long ones
    are refused, the short ones kept up to the record limit; memory stays bounded; the server serves on."""
    srv, h = _prefill(Handoffs(retention_s=300, max_records=1000))
    rss0 = _rss()
    try:
        long_ids = Attacker("done-flood", port=srv.port, token=TOKEN, engine_id="decode-9", prefill_engine=PREFILL,
                            n=2000, id_len=60000).result(timeout=300)
        rss1 = _rss()
        short_ids = Attacker("done-flood", port=srv.port, token=TOKEN, engine_id="decode-9", prefill_engine=PREFILL,
                             n=5000, id_len=200).result(timeout=300)
        rss2 = _rss()
        d = _decode(srv.port)
        assert d.call({"op": "hello"})["cache_id"] == 1
        d.close()
    finally:
        srv.close()
    print(f"\ndone ids: 2,000 x 60,000 chars: {long_ids}, RSS +{(rss1 - rss0) / MiB:.1f} MiB; 5,000 x 200: "
          f"ok {short_ids.get('ok')}, {len(h)} records, RSS +{(rss2 - rss0) / MiB:.1f} MiB")
    assert long_ids.get("ok") == 0 and long_ids.get("refused") == 2000, long_ids
    assert rss1 - rss0 < 16 * MiB
    assert short_ids.get("ok") == 5000 and len(h) <= 1000, (short_ids, len(h))
    assert rss2 - rss0 < 16 * MiB


def test_deeply_nested_json_drops_the_connection_and_serving_goes_on():
    caught = []
    old_hook = threading.excepthook
    threading.excepthook = caught.append
    srv, _ = _prefill()
    try:
        res = Attacker("deep-json", port=srv.port, token=TOKEN, engine_id="decode-7", prefill_engine=PREFILL,
                       depth=3000).result()
        d = _decode(srv.port)
        assert d.call({"op": "hello"})["cache_id"] == 1
        d.close()
    finally:
        threading.excepthook = old_hook
        srv.close()
    assert res == {"closed_unauthenticated": True, "closed_authenticated": True}, res
    assert caught == [], [f"{a.exc_type.__name__} in {a.thread}" for a in caught]


# ------------------------------------------------------------------ pieces, in this process


def test_parse_refuses_deep_long_and_non_objects():
    for bad in (b"[" * 3000, b'{"a":' * 5 + b"1" + b"}" * 5, b"x" * 5000, b"[1]", b"{", b'"s"'):
        with pytest.raises(ValueError):
            parse(bad)
    assert parse(b'{"a":"[[[[[[{{{{{{","b":[[1]]}') == {"a": "[[[[[[{{{{{{", "b": [[1]]}


def test_handoffs_binding_leases_and_bounds():
    h = Handoffs(retention_s=10, max_records=4, max_open=2)
    h.hold("a", 5, now=0)
    assert h.claim("a", "d1") is None and h.claim("a", "d1") is None  # idempotent for its owner
    assert h.claim("a", "d2") and h.done("a", "d2")
    assert h.claim("b", "d1") is None and h.claim("c", "d1") == "too many open claims"
    assert h.finished(now=1) == (set(), set())
    assert h.finished(now=6) == (set(), {"a"})  # lease over: freed, and refused from now on
    assert h.claim("a", "d1") == "request already released"
    for i in range(10):  # closed records: the oldest go, the open claim stays
        assert h.done(f"x{i}", "d1") is None
    assert len(h) <= 4 and h.done("b", "d2")
    h.hold("b", 100, now=6)
    assert h.done("b", "d1") is None and h.finished(now=7) == ({"b"}, set())


def test_hello_claim_and_done():
    srv, h = _prefill(token=None)
    c = _decode(srv.port, token=None)
    try:
        assert c.call({"op": "hello"})["cache_id"] == 1
        h.hold("r1", 60)
        c.call({"op": "claim", "req": "r1"})
        c.call({"op": "done", "req": "r1"})
        assert h.finished() == ({"r1"}, set())
        with pytest.raises(ValueError, match="unknown op"):
            c.call({"op": "nope"})
    finally:
        c.close()
        srv.close()


def test_auth_token_required_and_checked_both_ways():
    srv, h = _prefill()
    good = _decode(srv.port)
    bad = _decode(srv.port, token="wrong")
    none = _decode(srv.port, token=None)
    other = _decode(srv.port, peer="prefill-engine-1")  # expects another prefill (restarted, or a wrong port)
    try:
        assert good.call({"op": "hello"})["cache_id"] == 1
        for c, why in ((bad, "refused"), (none, "refused"), (other, "expected")):
            with pytest.raises((ConnectionError, OSError), match=why):
                c.call({"op": "done", "req": "x"})
        assert len(h) == 0
    finally:
        for c in (good, bad, none, other):
            c.close()
        srv.close()


def test_unreachable_peer_fails_fast():
    srv, _ = _prefill()
    port = srv.port
    srv.close()
    c = _decode(port)
    with pytest.raises(OSError):
        c.call({"op": "hello"})


def test_replayed_or_forged_message_closes_the_connection():
    """After the hand-shake every line carries a mac over its sequence number: a line sent again (a replayed
    "done") or altered is refused and the connection closed, before the message is acted on."""
    srv, h = _prefill()
    c = _decode(srv.port)
    try:
        for tamper in (lambda line: line, lambda line: line.replace(b'"r2"', b'"r3"')):
            c.call({"op": "hello"})
            line = c._session.seal({"op": "done", "req": "r2"})
            c._f.write(line)
            c._f.flush()
            assert c._session.open(c._f.readline())["ok"]
            c._f.write(tamper(line))  # the same line again, or with another request id
            c._f.flush()
            assert c._f.readline() == b""  # closed
            c.close()
        assert h.done("r3", "decode-2") is None  # r3 was never bound to decode-1
    finally:
        c.close()
        srv.close()
