# SPDX-License-Identifier: Apache-2.0
"""kvblocks.integrations.notices over real links: a holder engine (here, listening, with a token), the
engine a request is handed to (here) and a hostile third engine holding the token (tests/notice_peer.py,
its own process) that sends done / abort / lease for requests it was not handed, oversize and malformed
notices, and floods."""
import os
import time

import pytest

import kvblocks as kb
from conftest import free_port
from kvblocks.integrations import notices
from kvblocks.integrations.notices import Holder, Inbox
from procs import Peer as Proc

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "notice-token"
H, D, X = 101, 202, 303  # holder, the decode a request is handed to, a third engine


class World:
    def __init__(self):
        self.port = free_port()
        self.h = kb.LlmDataDist(H, kb.LlmRole.PROMPT)
        self.h.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                           kb.OPTION_AUTH_TOKEN: TOKEN})
        self.d = kb.LlmDataDist(D, kb.LlmRole.DECODER)
        self.d.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_AUTH_TOKEN: TOKEN})
        info = kb.ClusterInfo(H, 0, [kb.IpInfo("127.0.0.1", 0)], [kb.IpInfo("127.0.0.1", self.port)])
        assert self.d.link_llm_clusters([info]) == [kb.Status.LLM_SUCCESS]
        self.log = []
        self.holder = Holder(max_early=64, early_ttl_s=60)
        self.inbox = Inbox(self.h, self.holder, log=self.log.append)
        self.x = None

    def third(self):
        """The hostile engine, in its own process, linked to the holder with the token."""
        self.x = Proc(X, argv=[os.path.join(HERE, "notice_peer.py"), "--cluster", str(X), "--holder", str(H),
                               "--port", str(self.port), "--auth", TOKEN])
        assert self.x.info["ready"], self.x.info
        return self.x

    def poll_until(self, pred, timeout=5.0):
        end = time.monotonic() + timeout
        got = []
        while time.monotonic() < end:
            got += self.inbox.poll()
            if pred(got):
                return got
            time.sleep(0.01)
        return got

    def close(self):
        if self.x is not None:
            self.x.close(kill=True)
        self.d.finalize()
        self.h.finalize()


@pytest.fixture
def w():
    world = World()
    yield world
    world.close()


def test_done_from_the_engine_handed_the_request_frees_it(w):
    t = notices.new_ticket()
    assert w.holder.hold("req-1", t, lease_s=60)
    notices.send(w.d, H, "done", "req-1", t)
    got = w.poll_until(lambda g: g)
    assert [(n.sender, n.kind, why) for n, why in got] == [(D, "done", None)]
    assert w.holder.finished() == ({"req-1"}, set())
    assert w.holder.owner("req-1") is None  # forgotten


def test_third_peer_done_or_abort_for_a_request_it_was_not_handed_is_refused(w):
    """X holds the token and a link but not the request's ticket: its done and abort free nothing; once
    D has bound the request, even the right ticket from X is refused."""
    t = notices.new_ticket()
    w.holder.hold("req-1", t, lease_s=60)
    x = w.third()
    for kind in ("done", "abort", "lease"):
        assert x.call(op="send", kind=kind, rid="req-1", ticket=notices.new_ticket()) == {"ok": True}
    got = w.poll_until(lambda g: len(g) == 3)
    assert [(n.sender, why) for n, why in got] == [(X, "wrong ticket")] * 3
    assert w.holder.finished() == (set(), set())  # still held
    notices.send(w.d, H, "lease", "req-1", t, seconds=30)  # D binds it
    w.poll_until(lambda g: g)
    assert w.holder.owner("req-1") == D
    for kind in ("done", "abort"):
        x.call(op="send", kind=kind, rid="req-1", ticket=t)  # a leaked ticket
    got = w.poll_until(lambda g: len(g) == 2)
    assert [why for _, why in got] == ["request handed to another engine"] * 2
    assert w.holder.finished() == (set(), set())
    notices.send(w.d, H, "done", "req-1", t)
    w.poll_until(lambda g: g)
    assert w.holder.finished() == ({"req-1"}, set())
    assert any("refused done notice" in line and f"cluster {X}" in line for line in w.log)


def test_a_third_peer_cannot_preempt_with_an_early_notice(w):
    """Notices before the hold wait for it; X's (wrong ticket) is refused then, D's (right) applies."""
    t = notices.new_ticket()
    x = w.third()
    x.call(op="send", kind="done", rid="req-2", ticket=notices.new_ticket())
    notices.send(w.d, H, "done", "req-2", t)
    assert [why for _, why in w.poll_until(lambda g: len(g) == 2)] == [None, None]  # kept early
    assert w.holder.finished() == (set(), set())
    w.holder.hold("req-2", t, lease_s=60)
    assert w.holder.owner("req-2") == D
    assert w.holder.finished() == ({"req-2"}, set())
    assert w.holder.stats.refused == {"wrong ticket": 1}


def test_oversize_and_malformed_notices_are_dropped_and_serving_goes_on(w):
    t = notices.new_ticket()
    w.holder.hold("req-3", t, lease_s=60)
    x = w.third()
    ok = notices.encode("done", "req-3", t)
    bad = [
        (notices.NAME, ok[:-1] + " " * (notices.MAX_MESSAGE - len(ok) + 1) + "}"),  # oversize (valid JSON)
        (notices.NAME, "[" * 1000),  # deep nesting, at the runtime's 1024-byte limit
        (notices.NAME, "not json"),
        (notices.NAME, '{"k":"done","r":"req-3"}'),  # no ticket
        (notices.NAME, '{"k":"free","r":"req-3","t":"%s"}' % t),  # unknown kind
        (notices.NAME, '{"k":"done","r":5,"t":"%s"}' % t),
        (notices.NAME, '{"k":"lease","r":"req-3","t":"%s","s":1e300}' % t),
        (notices.NAME, '{"k":"done","r":"%s","t":"%s"}' % ("r" * 300, t)),
        ("someone/else", ok),  # not our name
    ]
    for name, msg in bad:
        assert x.call(op="raw", name=name, message=msg) == {"ok": True}
    assert w.poll_until(lambda g: False, timeout=0.5) == []
    assert sum(w.inbox.dropped.values()) == len(bad), w.inbox.dropped
    assert w.holder.finished() == (set(), set())  # nothing freed
    notices.send(w.d, H, "done", "req-3", t)
    w.poll_until(lambda g: g)
    assert w.holder.finished() == ({"req-3"}, set())


def test_a_flood_is_bounded_and_the_real_done_still_lands(w):
    """X fills the holder's notification queue (the runtime's cap) with done notices for made-up
    requests: the holder keeps at most max_early of them, and D's done lands once the queue drains."""
    t = notices.new_ticket()
    w.holder.hold("req-4", t, lease_s=60)
    x = w.third()
    res = x.call(op="flood", n=5000, timeout=120)
    assert res["stopped"] and 4000 <= res["sent"] <= 4096, res
    with pytest.raises(kb.LinkError):
        notices.send(w.d, H, "done", "req-4", t)  # the queue is full: nothing queued, the sender knows
    w.inbox.poll()
    assert len(w.holder) <= 1 + w.holder.max_early
    notices.send(w.d, H, "done", "req-4", t)
    w.poll_until(lambda g: g)
    assert w.holder.finished() == ({"req-4"}, set())


def test_leases_extend_within_bounds_and_expiry_frees():
    h = Holder(max_lease_s=10, max_renewals=2)
    t = notices.new_ticket()
    h.hold("r", t, lease_s=5, now=0)
    assert h.accept(notices.Notice(D, "lease", "r", t, 1000), now=1) is None
    assert h.finished(now=10.5) == (set(), set())  # extended to 11, not to 1001
    assert h.finished(now=11.5) == (set(), {"r"})
    h.hold("s", t, lease_s=5, now=0)
    assert h.accept(notices.Notice(D, "lease", "s", t, 5), now=0) is None
    assert h.accept(notices.Notice(D, "lease", "s", t, 5), now=0) is None
    assert h.accept(notices.Notice(D, "lease", "s", t, 5), now=0) == "too many lease renewals"
    assert h.accept(notices.Notice(D, "done", "s", t), now=1) is None
    assert h.accept(notices.Notice(D, "done", "s", t), now=1) == "request already released"
    assert h.finished(now=2) == ({"s"}, set())
    assert h.accept(notices.Notice(D, "done", "s", t), now=3) == "request already released"


def test_holds_are_bounded():
    h = Holder(max_held=2)
    assert h.hold("a", notices.new_ticket(), 5) and h.hold("b", notices.new_ticket(), 5)
    assert not h.hold("c", notices.new_ticket(), 5)


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(ValueError):
        notices.encode("free", "r", notices.new_ticket())
    with pytest.raises(ValueError):
        notices.encode("done", "r" * 600, notices.new_ticket())
    n = notices.decode(7, notices.NAME, notices.encode("lease", "r", "a" * 32, 3))
    assert (n.sender, n.kind, n.rid, n.seconds) == (7, "lease", "r", 3.0)


def test_a_peer_without_the_token_cannot_notify(w):
    """Notices ride the link: an engine without the token never links, so it never reaches the holder."""
    x = Proc(X, argv=[os.path.join(HERE, "notice_peer.py"), "--cluster", str(X), "--holder", str(H),
                      "--port", str(w.port)])
    try:
        assert not x.info["ready"]
        assert x.call(op="send", kind="done", rid="r", ticket=notices.new_ticket())["status"] == \
            kb.Status.LLM_NOT_YET_LINK
    finally:
        x.close(kill=True)


def test_reservations_are_taken_only_from_the_named_engine_and_bounded(w):
    """Layer-wise push: the pusher uses the reservation of the engine its params name, never another's;
    malformed reservations are dropped; the table is bounded."""
    res = notices.Reservations(max_entries=8, ttl_s=60)
    w.inbox.reservations = res
    t = notices.new_ticket()
    x = w.third()
    x.call(op="raw", name=notices.NAME, message=notices.encode_reserve("xfer-1", notices.new_ticket(), [9, 9], 0))
    notices.send_reserve(w.d, H, "xfer-1", t, [4, 5, 6], 1)
    bad = ['{"k":"reserve","r":"x","t":"%s","b":[],"o":0}' % t, '{"k":"reserve","r":"x","t":"%s","b":[-1],"o":0}' % t,
           '{"k":"reserve","r":"x","t":"%s","b":[1.5],"o":0}' % t, '{"k":"reserve","r":"x","t":"%s","b":[1],"o":true}' % t,
           '{"k":"reserve","k":"done","r":"x","t":"%s","s":0%s}' % (t, " " * 600)]
    for msg in bad:
        x.call(op="raw", name=notices.NAME, message=msg)
    w.poll_until(lambda g: len(res) == 2, timeout=2)
    assert sum(w.inbox.dropped.values()) == len(bad)
    got = res.take("xfer-1", D)
    assert (got.blocks, got.offset, got.ticket) == ((4, 5, 6), 1, t)
    assert res.take("xfer-1", D) is None  # taken once
    assert res.take("xfer-1", X).blocks == (9, 9)  # X's is its own, never D's
    with pytest.raises(ValueError):
        notices.encode_reserve("x", t, list(range(1000)), 0)
    for i in range(20):
        res.add(notices.Notice(X, "reserve", f"f{i}", t, 0.0, (1,), 0))
    assert len(res) == 8


def test_a_request_handed_to_two_pullers_is_freed_after_both_over_real_links(w):
    """Unequal tensor parallelism: two decode ranks (D here, X in its own process) pull one prefill
    rank's blocks and each say done with pullers=2; the first done frees nothing, the second does. A
    third sender is refused once two are bound, a second done from the same one too, and a notice whose
    pullers count differs from the first's."""
    t = notices.new_ticket()
    w.holder.hold("req-tp", t, lease_s=60)
    notices.send(w.d, H, "done", "req-tp", t, pullers=2)
    assert [why for _, why in w.poll_until(lambda g: g)] == [None]
    assert w.holder.finished() == (set(), set())  # one of two: still held
    notices.send(w.d, H, "done", "req-tp", t, pullers=2)
    assert [why for _, why in w.poll_until(lambda g: g)] == ["this engine already said done"]
    x = w.third()
    assert x.call(op="send", kind="done", rid="req-tp", ticket=t, pullers=3) == {"ok": True}
    assert [why for _, why in w.poll_until(lambda g: g)] == ["pullers count differs from the first notice's"]
    assert x.call(op="send", kind="done", rid="req-tp", ticket=t, pullers=2) == {"ok": True}
    assert [why for _, why in w.poll_until(lambda g: g)] == [None]
    assert w.holder.owners("req-tp") == [D, X]
    assert w.holder.finished() == ({"req-tp"}, set())
    assert w.holder.released_by("req-tp") == "done"


def test_pullers_bind_at_most_their_count_and_one_abort_makes_it_an_abort():
    h = Holder()
    t = notices.new_ticket()
    h.hold("r", t, lease_s=60, now=0)
    assert h.accept(notices.Notice(D, "done", "r", t, pullers=2), now=1) is None
    assert h.accept(notices.Notice(X, "abort", "r", t, pullers=2), now=1) is None
    assert h.finished(now=2) == ({"r"}, set()) and h.released_by("r") == "abort"
    h.hold("s", t, lease_s=60, now=0)
    assert h.accept(notices.Notice(D, "lease", "s", t, 30, pullers=2), now=1) is None
    assert h.accept(notices.Notice(X, "lease", "s", t, 30, pullers=2), now=1) is None
    assert h.accept(notices.Notice(H, "done", "s", t, pullers=2), now=1) == "request handed to another engine"
    assert h.finished(now=2) == (set(), set())
    with pytest.raises(ValueError):
        notices.encode("done", "r", t, pullers=0)
    with pytest.raises(ValueError):
        notices.encode("done", "r", t, pullers=notices.MAX_PULLERS + 1)
    assert '"n"' not in notices.encode("done", "r", t)  # one puller: the wire of earlier versions
    assert notices.decode(7, notices.NAME, notices.encode("done", "r", t, pullers=2)).pullers == 2
    with pytest.raises(ValueError, match="bad pullers count"):
        notices.decode(7, notices.NAME, '{"k":"done","r":"r","t":"%s","n":0}' % t)
