# SPDX-License-Identifier: Apache-2.0
"""Notifications in kvblocks' own API (LlmDataDist.send_notify / get_notifies) and on the wire: size
limits, the queue cap, and a hostile peer that floods or sends malformed NOTIFY frames."""
import struct

import pytest

import kvblocks as kb
from conftest import Pair
from hostile import open_link, recv_frame, send_frame

NOTIFY, NOTIFY_ACK = 16, 17
LLM_LINK_BUSY = 0x5010B01B
NOTE = struct.Struct("<QIII")


def notify_payload(seq, name=b"n", msg=b"m", name_len=None, msg_len=None):
    return NOTE.pack(seq, 0, len(name) if name_len is None else name_len,
                     len(msg) if msg_len is None else msg_len) + name + msg


@pytest.fixture
def linked_pair():
    p = Pair(role_p=kb.LlmRole.MIX, role_d=kb.LlmRole.MIX)
    p.link()
    yield p
    p.close()


def test_send_and_get_in_order_both_directions(linked_pair):
    p, d = linked_pair.p, linked_pair.d
    assert p.get_notifies() == []
    d.send_notify(1, "cache_ready", "block_0")
    d.send_notify(1, b"raw", b"\xff\x00bytes")
    p.send_notify(2, "back", "é")  # the accepting side may notify too
    assert p.get_notifies() == [(2, "cache_ready", "block_0"), (2, "raw", "\ufffd\x00bytes")]
    assert p.get_notifies() == []
    assert d.get_notifies() == [(1, "back", "é")]


def test_limits_and_errors(linked_pair):
    d = linked_pair.d
    d.send_notify(1, "x" * 1024, "y" * 1024)
    with pytest.raises(kb.ParamInvalidError, match="name"):
        d.send_notify(1, "x" * 1025, "m")
    with pytest.raises(kb.ParamInvalidError, match="message"):
        d.send_notify(1, "n", "é" * 513)  # 1026 UTF-8 bytes
    with pytest.raises(kb.ParamInvalidError, match="timeout"):
        d.send_notify(1, "n", "m", 0)
    with pytest.raises(kb.LinkError) as e:
        d.send_notify(99, "n", "m")
    assert e.value.status_code == kb.Status.LLM_NOT_YET_LINK
    with pytest.raises(TypeError):
        d.send_notify(1, 5, "m")
    assert [(len(n), len(m)) for _, n, m in linked_pair.p.get_notifies()] == [(1024, 1024)]


def test_queue_cap(linked_pair):
    p, d = linked_pair.p, linked_pair.d
    for i in range(4096):
        d.send_notify(1, "n", str(i))
    with pytest.raises(kb.LinkError) as e:
        d.send_notify(1, "n", "over")
    assert e.value.status_code == LLM_LINK_BUSY
    got = p.get_notifies()
    assert len(got) == 4096 and got[-1][2] == "4095"
    d.send_notify(1, "n", "again")
    assert p.get_notifies() == [(2, "n", "again")]


def test_not_initialized():
    dd = kb.LlmDataDist(5, kb.LlmRole.MIX)
    with pytest.raises(kb.LLMException):
        dd.get_notifies()
    with pytest.raises(kb.LLMException):
        dd.send_notify(1, "n", "m")


def test_hostile_flood_is_capped_and_malformed_frames_are_ignored():
    """A peer flooding NOTIFYs gets LINK_BUSY past 4096 queued (nothing more is kept); malformed ones
    (a name over 1024 bytes, lengths that do not match the payload) and stray acks are dropped
    without an answer, and the link keeps working."""
    p = Pair(role_p=kb.LlmRole.MIX)
    try:
        ctrl, _ = open_link(p.port, cluster_id=77)
        ctrl.settimeout(10)
        send_frame(ctrl, NOTIFY, notify_payload(1, name=b"x" * 1025))
        send_frame(ctrl, NOTIFY, notify_payload(2, name_len=100))
        send_frame(ctrl, NOTIFY, notify_payload(3) + b"trailing")
        send_frame(ctrl, NOTIFY_ACK, notify_payload(12345))
        statuses = []
        for seq in range(10, 10 + 4100):
            send_frame(ctrl, NOTIFY, notify_payload(seq, msg=b"%d" % seq))
            t, _, payload = recv_frame(ctrl)
            assert t == NOTIFY_ACK
            ack_seq, status, nl, ml = NOTE.unpack(payload)
            assert ack_seq == seq and nl == ml == 0  # the malformed ones were never answered
            statuses.append(status)
        assert statuses == [0] * 4096 + [LLM_LINK_BUSY] * 4
        got = p.p.get_notifies()
        assert len(got) == 4096 and got[0] == (77, "n", "10")
        send_frame(ctrl, NOTIFY, notify_payload(9000))
        assert NOTE.unpack(recv_frame(ctrl)[2])[:2] == (9000, 0)
        assert p.p.get_notifies() == [(77, "n", "m")]
        ctrl.close()
    finally:
        p.close()
