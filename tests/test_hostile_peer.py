# SPDX-License-Identifier: Apache-2.0
"""The serving side trusts nothing: forged ids, out-of-range blocks, huge lengths, truncated frames and
garbage get error replies; no byte outside the registered caches moves and the process survives."""
import socket
import struct

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from hostile import (ERROR, READ_REQ, READ_RESP, WRITE_DONE, WRITE_READY, WRITE_REQ, handshake, open_link,
                     recv_frame, request, send_frame)
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
    try:
        t, status, _ = recv_frame(g)
        assert t == ERROR
    except (ConnectionError, AssertionError, struct.error):
        pass
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
