# SPDX-License-Identifier: Apache-2.0
"""The serving side trusts nothing: forged ids, out-of-range blocks, huge lengths, truncated frames and
garbage get error replies; no byte outside the registered caches moves and the process survives."""
import socket
import struct

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from hostile import (CACHE_INFO, CACHE_QUERY, CAP_CACHE_QUERY, CAP_KEY_QUERY, CAP_TCP, ERROR, READ_REQ, READ_RESP, TABLE_ENTRY,
                     WRITE_DONE, WRITE_READY, WRITE_REQ, handshake, open_link, recv_frame, request, send_frame,
                     QUERY_BY_BATCH_KEY, QUERY_BY_CACHE_KEY, table_entry)
from peer import pattern
from procs import Peer

TENSORS, BLOCKS, BB = 4, 8, 64
TB = BLOCKS * BB


@pytest.fixture
def victim():
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    ctrl, token = open_link(port)
    data, status, _ = handshake(port, 2, 77, token=token)
    assert status == 0
    before = peer.digest()
    yield peer, port, data, token
    data.close()
    ctrl.close()
    assert peer.proc.poll() is None, "the serving process must survive"
    assert peer.digest() == before, "no cache byte may change"
    peer.close()


def _read_ok(data, peer, cache="reg"):
    send_frame(data, READ_REQ, request(peer.info[cache], [1], [(2 * BB, BB)]))
    t, status, payload = recv_frame(data)
    assert (t, status) == (READ_RESP, 0)
    assert payload == pattern(1, 1, BLOCKS, BB)[2].tobytes()


@pytest.mark.parametrize("cache_id,tensors,segments,data_len,expect", [
    (999, [0], [(0, BB)], None, kb.Status.LLM_KV_CACHE_NOT_EXIST),           # forged cache id
    (-5, [0], [(0, BB)], None, kb.Status.LLM_KV_CACHE_NOT_EXIST),
    ("reg", [TENSORS], [(0, BB)], None, kb.Status.LLM_PARAM_INVALID),        # tensor out of range
    ("reg", [0], [(TB - 8, BB)], None, kb.Status.LLM_PARAM_INVALID),         # block past the end
    ("reg", [0], [(BLOCKS * BB, BB)], None, kb.Status.LLM_PARAM_INVALID),    # block index == num_blocks
    ("alloc", [0], [(2**63, 2**63)], None, kb.Status.LLM_PARAM_INVALID),    # overflowing range
    ("alloc", [0], [(0, 2**62)], None, kb.Status.LLM_PARAM_INVALID),        # huge length
    ("alloc", [0], [(0, BB)], 12345, kb.Status.LLM_PARAM_INVALID),          # data length lies
    ("alloc", [0] * 1000, [(0, BB)] * 1000, 2**64 - 1, kb.Status.LLM_PARAM_INVALID),
    ("alloc", [0, 1, 2, 3], [(0, 0)] * 50000, 0, kb.Status.LLM_PARAM_INVALID),  # empty segments
    ("alloc", [0, 1, 2, 3] * 2, [(0, 1)] * 8, None, kb.Status.LLM_PARAM_INVALID),  # more tensors than exist
])
def test_bad_reads_get_an_error_and_the_channel_stays_usable(victim, cache_id, tensors, segments, data_len, expect):
    peer, _, data, _ = victim
    cid = peer.info[cache_id] if isinstance(cache_id, str) else cache_id
    send_frame(data, READ_REQ, request(cid, tensors, segments, data_len))
    t, status, payload = recv_frame(data)
    assert (t, status, payload) == (READ_RESP, expect, b"")
    _read_ok(data, peer)


@pytest.mark.parametrize("inline", [False, True])
def test_bad_writes_are_refused_before_any_byte_lands(victim, inline):
    peer, _, data, _ = victim
    body = request(peer.info["alloc"], [0], [(TB - 8, 64)])
    if inline:
        send_frame(data, WRITE_REQ, body, flags=1)
        data.sendall(b"\xff" * 64)
        t, status, _ = recv_frame(data)
        assert (t, status) == (WRITE_DONE, kb.Status.LLM_PARAM_INVALID)
    else:
        send_frame(data, WRITE_REQ, body)
        t, status, _ = recv_frame(data)
        assert (t, status) == (WRITE_READY, kb.Status.LLM_PARAM_INVALID)
    _read_ok(data, peer)


def test_a_request_without_a_deadline_is_refused(victim):
    """Deadline 0 would mean 'serve forever' and pin the cache; the server refuses it."""
    peer, _, data, _ = victim
    for kw in ({"deadline": 0}, {"budget": 0}, {"budget": -5}):
        send_frame(data, READ_REQ, request(peer.info["reg"], [0], [(0, BB)], **kw))
        t, status, _ = recv_frame(data)
        assert (t, status) == (READ_RESP, kb.Status.LLM_PARAM_INVALID)
    _read_ok(data, peer)


def test_millions_of_scatter_entries_are_served_in_bounded_memory(victim):
    """4 tensors x ~4M one-byte segments (16M scatter entries, just under the frame limit) is a
    valid request; the server streams it in batches instead of building 16M iovecs at once."""
    peer, _, data, _ = victim
    n = (64 << 20) // 16 - 4
    head = struct.pack("<qqqIIQ", peer.info["reg"], 2**62, 10**10, 4, n, 4 * n) + struct.pack("<4I", 0, 1, 2, 3)
    send_frame(data, READ_REQ, head + struct.pack("<QQ", 7, 1) * n)
    t, status, payload = recv_frame(data)
    assert (t, status, len(payload)) == (READ_RESP, 0, 4 * n)
    assert payload[:n] == pattern(1, 0, BLOCKS, BB).reshape(-1)[7:8].tobytes() * n
    _read_ok(data, peer)


def test_malformed_request_payload(victim):
    peer, _, data, _ = victim
    good = request(peer.info["reg"], [0], [(0, BB)])
    send_frame(data, READ_REQ, good[:-3])  # segment list cut short
    t, status, _ = recv_frame(data)
    assert (t, status) == (READ_RESP, kb.Status.LLM_PARAM_INVALID)
    send_frame(data, 999, b"xyz")  # unknown message type
    t, status, _ = recv_frame(data)
    assert (t, status) == (ERROR, kb.Status.LLM_PARAM_INVALID)
    _read_ok(data, peer)


def test_oversized_frame_and_garbage_close_only_that_connection(victim):
    peer, port, data, token = victim
    send_frame(data, READ_REQ, b"", length=2**40)
    t, status, _ = recv_frame(data)
    assert (t, status) == (ERROR, kb.Status.LLM_PARAM_INVALID)
    assert data.recv(1) == b""
    g, status, _ = handshake(port, 2, 77, token=token)
    g.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"\x00" * 64)
    g.settimeout(5)
    # The listener may answer the garbage with ERROR frames, but nothing else, and it must close the
    # connection (recv returns b"" rather than timing out).
    answers = []
    while True:
        head = g.recv(1, socket.MSG_PEEK)
        if not head:
            break
        answers.append(recv_frame(g)[0])
    assert set(answers) <= {ERROR}, answers
    g.close()
    fresh, status, _ = handshake(port, 2, 77, token=token)
    assert status == 0
    _read_ok(fresh, peer)
    fresh.close()


def test_truncated_frames_and_raw_garbage_on_the_listener(victim):
    peer, port, data, token = victim
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\x4b\x56\x42\x31\x01\x00")  # half a header, then hang up
    s.close()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\xde\xad\xbe\xef" * 64)
    s.close()
    send_frame(data, READ_REQ, request(peer.info["reg"], [0], [(0, BB)])[:10], length=40)  # truncated body
    data.close()
    fresh, status, _ = handshake(port, 2, 77, token=token)
    assert status == 0
    _read_ok(fresh, peer)
    fresh.close()


def test_data_channel_needs_the_link_token(victim):
    peer, port, _, _ = victim
    s, status, _ = handshake(port, 2, 77, token=b"\x01" * 16)
    assert status == kb.Status.LLM_NOT_YET_LINK
    s.close()
    s, status, _ = handshake(port, 2, 12345, token=b"\0" * 16)
    assert status == kb.Status.LLM_NOT_YET_LINK
    s.close()


def test_a_real_decoder_still_works_after_the_attack(victim):
    peer, port, _, _ = victim
    me = kb.LlmDataDist(2, kb.LlmRole.DECODER)
    me.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: "tcp"})
    try:
        dst = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BB]))
        assert me.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        me.pull_kv_blocks(kb.CacheIndex(1, peer.info["reg"]), dst, [3], [0])
        assert np.array_equal(dst.numpy(2)[0], pattern(1, 2, BLOCKS, BB)[3])
    finally:
        me.finalize()


# ---------------------------------------------------------------- CACHE_QUERY answers (issue 31)
@pytest.fixture
def asker():
    """A real engine (the peer process) linked to a fake opener that says it answers CACHE_QUERY."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB, wait_ms=500)
    ctrl, _ = open_link(port, caps=CAP_TCP | CAP_CACHE_QUERY)
    before = peer.digest()
    yield peer, port, ctrl
    ctrl.close()
    assert peer.proc.poll() is None, "the asking process must survive"
    assert peer.digest() == before, "no cache byte may change"
    peer.close()


def _pull_from_fake(peer, cache_id):
    peer.send(op="pull", cluster=77, remote_cache=cache_id, local="alloc", src=[0], dst=[0])


def _next_query(ctrl, timeout=5.0):
    """(cache id, seq) of the next CACHE_QUERY on the fake's control connection."""
    ctrl.settimeout(timeout)
    while True:
        t, _, payload = recv_frame(ctrl)
        if t == CACHE_QUERY:
            return struct.unpack("<qQ", payload)


def _info(cache_id, seq, count, entries=b""):
    return struct.pack("<qQI", cache_id, seq, count) + entries


GOOD_SIZES = dict(num_tensors=TENSORS, tensor_bytes=TB, num_blocks=BLOCKS, batch_size=BLOCKS, stride=BB)


@pytest.mark.parametrize("answer", [
    lambda q: b"\xff" * 7,                                                          # garbage
    lambda q: _info(5, q, 1, table_entry(6, **GOOD_SIZES)),                         # another id
    lambda q: _info(5, q, 2, table_entry(5, **GOOD_SIZES) * 2),                     # two entries
    lambda q: _info(5, q, 0xFFFFFFFF),                                              # huge count
    lambda q: _info(5, q, 1, table_entry(5, num_tensors=1, tensor_bytes=64, num_blocks=2, stride=64)),  # overrun
    lambda q: _info(5, q, 1, table_entry(5, num_tensors=0)),                        # no tensors
    lambda q: _info(5, q, 1, table_entry(5, num_tensors=(1 << 20) + 1)),           # too many tensors
    lambda q: _info(5, q, 1, table_entry(5, **GOOD_SIZES, n_desc=1,
                                         descriptors=struct.pack("<BI", 2, 1 << 31))),  # descriptor overrun
    lambda q: _info(5, q, 1, table_entry(5, **GOOD_SIZES, n_desc=1,
                                         descriptors=struct.pack("<BI", 2, 8) + bytes(8))),  # 1 address, 4 tensors
    lambda q: _info(5, q, 0) + b"x",                                                # trailing bytes
    lambda q: _info(5, q, 0),                                                       # an honest "no such cache"
], ids=["garbage", "other-id", "two", "huge-count", "overrun", "no-tensors", "many-tensors", "desc-overrun",
        "addr-count", "trailing", "not-found"])
def test_a_bad_cache_info_answer_fails_the_call_cleanly(asker, answer):
    peer, _, ctrl = asker
    _pull_from_fake(peer, 5)
    cid, seq = _next_query(ctrl)
    assert cid == 5
    send_frame(ctrl, CACHE_INFO, answer(seq))
    r = peer.reply()
    assert r.get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST, r
    # Nothing was kept: the next call asks again, with a new seq.
    _pull_from_fake(peer, 5)
    cid, seq2 = _next_query(ctrl)
    assert cid == 5 and seq2 != seq
    send_frame(ctrl, CACHE_INFO, _info(5, seq, 1, table_entry(5, **GOOD_SIZES)))  # the old seq: not this query's
    send_frame(ctrl, CACHE_INFO, _info(5, seq2, 0))
    assert peer.reply().get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST


def test_an_oversized_cache_info_is_refused_with_the_link(asker):
    peer, _, ctrl = asker
    _pull_from_fake(peer, 5)
    assert _next_query(ctrl)[0] == 5
    send_frame(ctrl, CACHE_INFO, b"", length=1 << 30)  # announced, never sent: refused before reading it
    r = peer.reply()
    assert r.get("status") in (kb.Status.LLM_LINK_FAILED, kb.Status.LLM_NOT_YET_LINK), r


def test_a_peer_that_never_answers_times_the_call_out(asker):
    peer, _, ctrl = asker
    _pull_from_fake(peer, 5)
    assert _next_query(ctrl)[0] == 5
    r = peer.reply()  # llm.SyncKvCacheWaitTime = 500 ms
    assert r.get("status") == kb.Status.LLM_TIMEOUT, r


def test_an_unasked_cache_info_is_ignored(asker):
    peer, _, ctrl = asker
    send_frame(ctrl, CACHE_INFO, _info(9, 12345, 1, table_entry(9, **GOOD_SIZES)))
    _pull_from_fake(peer, 9)
    cid, seq = _next_query(ctrl)  # it asks: the unasked answer was not taken
    assert cid == 9 and seq != 12345
    send_frame(ctrl, CACHE_INFO, _info(9, seq, 0))
    assert peer.reply().get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST


def test_a_peer_without_the_capability_is_not_asked():
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB)
    ctrl, _ = open_link(port)  # CAP_TCP only: an older kvblocks
    try:
        r = peer.call(op="pull", cluster=77, remote_cache=5, local="alloc", src=[0], dst=[0])
        assert r.get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST, r
        assert "as of linking" in r["error"]
        ctrl.settimeout(0.3)
        with pytest.raises(socket.timeout):
            recv_frame(ctrl)
    finally:
        ctrl.close()
        peer.close()


def test_cache_query_is_answered_with_one_entry_or_none(victim):
    """The answering side: a forged id gets none; a real one gets its table entry."""
    peer, port, _, _ = victim
    ctrl, _ = open_link(port, cluster_id=78, caps=CAP_TCP | CAP_CACHE_QUERY)
    try:
        for seq, (cid, found) in enumerate(((999, False), (-1, False), (peer.info["alloc"], True))):
            send_frame(ctrl, CACHE_QUERY, struct.pack("<qQ", cid, seq))
            ctrl.settimeout(5)
            t, _, payload = recv_frame(ctrl)
            assert t == CACHE_INFO
            assert struct.unpack_from("<qQI", payload) == (cid, seq, 1 if found else 0)
            if found:
                fields = TABLE_ENTRY.unpack_from(payload, 20)
                assert fields[0] == cid and fields[3] == TENSORS and fields[4] == TB and fields[7] == BB
        send_frame(ctrl, CACHE_QUERY, b"\x01\x02")  # malformed: ignored, the link stays
        send_frame(ctrl, CACHE_QUERY, struct.pack("<qQ", peer.info["reg"], 7))
        t, _, payload = recv_frame(ctrl)
        assert t == CACHE_INFO and struct.unpack_from("<qQI", payload) == (peer.info["reg"], 7, 1)
    finally:
        ctrl.close()


# ---------------------------------------------------------------- CACHE_QUERY by key (issue 31)
@pytest.fixture
def key_asker():
    """A real engine linked to a fake opener that says it answers CACHE_QUERY by id and by key."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=BB, wait_ms=500)
    ctrl, _ = open_link(port, caps=CAP_TCP | CAP_CACHE_QUERY | CAP_KEY_QUERY)
    before = peer.digest()
    yield peer, port, ctrl
    ctrl.close()
    assert peer.proc.poll() is None, "the asking process must survive"
    assert peer.digest() == before, "no cache byte may change"
    peer.close()


def _next_key_query(ctrl, timeout=5.0):
    """(cache id, seq, kind, key) of the next CACHE_QUERY: a key query is 25 bytes."""
    ctrl.settimeout(timeout)
    while True:
        t, _, payload = recv_frame(ctrl)
        if t == CACHE_QUERY:
            assert len(payload) == 25, payload
            return struct.unpack("<qQBq", payload)


def _batch_keys(*keys):
    return struct.pack("<BI", 3, 8 * len(keys)) + struct.pack(f"<{len(keys)}q", *keys)


@pytest.mark.parametrize("batch,answer", [
    (True, lambda q: _info(5, q, 1, table_entry(5, **GOOD_SIZES, key=7))),                   # another key
    (True, lambda q: _info(5, q, 1, table_entry(5, **GOOD_SIZES, n_desc=1, descriptors=_batch_keys(1, 2)))),
    (True, lambda q: _info(6, q, 1, table_entry(5, **GOOD_SIZES, key=500))),                 # id mismatch
    (True, lambda q: _info(0, q, 1, table_entry(0, **GOOD_SIZES, key=500))),                 # id 0
    (False, lambda q: _info(5, q, 1, table_entry(5, **GOOD_SIZES, n_desc=1, descriptors=_batch_keys(500)))),
    (True, lambda q: _info(5, q, 2, table_entry(5, **GOOD_SIZES, key=500) * 2)),              # two entries
    (True, lambda q: _info(0, q, 0) + b"x"),                                                  # trailing bytes
    (False, lambda q: _info(0, q, 0)),                                                        # honest none
], ids=["other-key", "other-batch-keys", "other-id", "id-zero", "batch-key-for-cache-key", "two", "trailing",
        "not-found"])
def test_a_bad_answer_to_a_key_query_fails_the_lookup_cleanly(key_asker, batch, answer):
    peer, _, ctrl = key_asker
    peer.send(op="find_key", cluster=77, key=500, batch=batch)
    cid, seq, kind, key = _next_key_query(ctrl)
    assert (cid, kind, key) == (0, QUERY_BY_BATCH_KEY if batch else QUERY_BY_CACHE_KEY, 500)
    send_frame(ctrl, CACHE_INFO, answer(seq))
    r = peer.reply()
    assert r.get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST, r
    # Nothing was kept: the next lookup asks again; an honest answer is taken.
    peer.send(op="find_key", cluster=77, key=500, batch=batch)
    _, seq2, _, _ = _next_key_query(ctrl)
    assert seq2 != seq
    good = table_entry(5, **GOOD_SIZES, n_desc=1, descriptors=_batch_keys(-1, 500)) if batch else \
        table_entry(5, **GOOD_SIZES, key=500)
    send_frame(ctrl, CACHE_INFO, _info(5, seq2, 1, good))
    assert peer.reply() == ({"cache": 5, "batch": 1} if batch else {"cache": 5})


def test_a_key_query_that_gets_no_answer_times_out(key_asker):
    peer, _, ctrl = key_asker
    peer.send(op="find_key", cluster=77, key=500)
    assert _next_key_query(ctrl)[3] == 500
    r = peer.reply()  # llm.SyncKvCacheWaitTime = 500 ms
    assert r.get("status") == kb.Status.LLM_TIMEOUT, r


def test_a_peer_without_the_key_capability_is_not_asked_by_key(asker):
    peer, _, ctrl = asker  # capability 32 only: asked by id, never by key
    for batch in (True, False):
        r = peer.call(op="find_key", cluster=77, key=500, batch=batch)
        assert r.get("status") == kb.Status.LLM_KV_CACHE_NOT_EXIST, r
        assert "as of linking" in r["error"]
    ctrl.settimeout(0.3)
    with pytest.raises(socket.timeout):
        recv_frame(ctrl)


def test_key_queries_are_answered_with_one_entry_or_none(victim):
    """The answering side: an unbound key gets none; malformed key queries are ignored."""
    peer, port, _, _ = victim
    ctrl, _ = open_link(port, cluster_id=78, caps=CAP_TCP | CAP_CACHE_QUERY | CAP_KEY_QUERY)
    try:
        ctrl.settimeout(5)
        for seq, kind in enumerate((QUERY_BY_BATCH_KEY, QUERY_BY_CACHE_KEY)):
            send_frame(ctrl, CACHE_QUERY, struct.pack("<qQBq", 0, seq, kind, 12345))
            t, _, payload = recv_frame(ctrl)
            assert t == CACHE_INFO and payload == struct.pack("<qQI", 0, seq, 0)
        for bad in (struct.pack("<qQBq", 0, 50, 9, 1),                   # unknown kind
                    struct.pack("<qQBq", 0, 51, QUERY_BY_BATCH_KEY, -1),  # negative key
                    struct.pack("<qQBq", 3, 52, QUERY_BY_CACHE_KEY, 1),   # a cache id with a key
                    struct.pack("<qQB", 0, 53, QUERY_BY_CACHE_KEY),       # truncated
                    struct.pack("<qQBqB", 0, 54, QUERY_BY_CACHE_KEY, 1, 0)):  # trailing
            send_frame(ctrl, CACHE_QUERY, bad)
        send_frame(ctrl, CACHE_QUERY, struct.pack("<qQ", peer.info["reg"], 7))
        t, _, payload = recv_frame(ctrl)  # the first answer after them: the malformed ones got none
        assert t == CACHE_INFO and struct.unpack_from("<qQI", payload) == (peer.info["reg"], 7, 1)
    finally:
        ctrl.close()
