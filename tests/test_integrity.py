# SPDX-License-Identifier: Apache-2.0
"""kvblocks.Integrity=crc32c (README "Integrity", docs/protocol.md "Integrity"): every TCP transfer
carries a CRC32C per (tensor, segment), computed by the side that reads the source and checked by the
side that writes the destination. A real relay process between two real engines flips one bit of a
block in flight: with the option the call fails (LLM_FAILED, naming tensor, block and peer); without
it the same corruption arrives, which the tests show too."""
import json
import os
import select
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest

import kvblocks as kb
from conftest import cluster, free_port
from hostile import CAP_TCP, open_link, recv_frame, table_entry
from peer import pattern
from procs import Peer

S = kb.Status
HERE = os.path.dirname(os.path.abspath(__file__))
TENSORS, BLOCKS = 2, 8
INTEGRITY = "kvblocks.Integrity"  # kb.OPTION_INTEGRITY (a literal: the tests also run against older builds)
SMALL, LARGE = 4096, 512 << 10  # a push of one SMALL block goes inline, of one LARGE block after WRITE_READY


class FlipRelay:
    """tests/flip_relay.py in its own process, between the test's engine and the peer."""

    def __init__(self, target, marker, direction):
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "flip_relay.py"), "--target", str(target),
                                      "--marker", marker.hex(), "--direction", direction],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.port = self.line(30)["port"]

    def line(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        out = self.proc.stdout.readline() if ready else b""
        assert out, f"relay said nothing within {timeout} s (exit {self.proc.poll()})"
        return json.loads(out)

    def close(self):
        self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def marker(cluster_id, tensor, block):
    """The first 16 bytes of pattern(cluster_id)'s tensor/block: found nowhere else in a stream."""
    return pattern(cluster_id, tensor, block + 1, 16)[block].tobytes()


def engine(integrity, cid=2):
    me = kb.LlmDataDist(cid, kb.LlmRole.MIX)
    opts = {kb.OPTION_DEVICE_ID: "0", kb.OPTION_TRANSPORT: "tcp"}
    if integrity:
        opts[INTEGRITY] = integrity
    me.initialize(opts)
    return me


def one_bit_apart(a, b):
    return int(np.unpackbits(np.bitwise_xor(a, b)).sum()) == 1


@pytest.fixture(params=[SMALL, LARGE], ids=["small", "large"])
def peer(request):
    """Cluster 1, its own process, TCP only; its "reg" cache holds pattern(1), "alloc" too."""
    port = free_port()
    p = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=BLOCKS, block_bytes=request.param)
    yield p, port, request.param
    p.close()


@pytest.mark.parametrize("integrity", ["crc32c", None])
def test_pull_with_a_bit_flipped_in_flight(peer, integrity):
    """Contract: with kvblocks.Integrity=crc32c a pull whose bytes were corrupted between the engines
    fails with LLM_FAILED and a message naming the tensor, the block (this side's) and the peer
    cluster; the relay did flip the bit. Without the option the same pull succeeds and the flipped
    bit is in the destination (what the option exists for)."""
    p, port, bb = peer
    relay = FlipRelay(port, marker(1, 1, 5), "pull")
    me = engine(integrity)
    try:
        assert me.link_llm_clusters([cluster(1, relay.port)], 5000) == [S.LLM_SUCCESS]
        dst = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, bb]))
        src_blocks, dst_blocks = [3, 5], [0, 1]
        if integrity:
            with pytest.raises(kb.LLMException) as e:
                me.pull_kv_blocks(kb.CacheIndex(1, p.info["reg"]), dst, src_blocks, dst_blocks)
            print(f"\nchecked pull: {e.value}")
            assert e.value.status_code == S.LLM_FAILED
            assert "CRC32C mismatch in tensor 1, block 1 " in str(e.value)
            assert "pulled from cache" in str(e.value) and "of cluster 1" in str(e.value)
            assert relay.line(10)["flipped"] > 0
            # The channel stayed in step: the next pull (nothing flipped now) is checked and lands.
            me.pull_kv_blocks(kb.CacheIndex(1, p.info["reg"]), dst, src_blocks, dst_blocks)
            assert np.array_equal(dst.numpy(1)[1], pattern(1, 1, BLOCKS, bb)[5])
            # ... and the operator sees the mismatch in the metrics (one failed check, this peer).
            [peer_m] = [m for m in me.metrics()["peers"] if m["peer"] == 1]
            assert peer_m["crc_mismatches"] == 1, peer_m
        else:
            me.pull_kv_blocks(kb.CacheIndex(1, p.info["reg"]), dst, src_blocks, dst_blocks)
            assert relay.line(10)["flipped"] > 0
            got, want = dst.numpy(1)[1], pattern(1, 1, BLOCKS, bb)[5]
            assert one_bit_apart(got, want), "the flipped bit did not arrive unnoticed"
            assert np.array_equal(dst.numpy(0)[1], pattern(1, 0, BLOCKS, bb)[5])
    finally:
        me.finalize()
        relay.close()


@pytest.mark.parametrize("integrity", ["crc32c", None])
def test_push_with_a_bit_flipped_in_flight(peer, integrity):
    """Contract: with the option, the serving peer checks a push's bytes before it answers: a bit
    flipped in flight fails the push with LLM_FAILED naming this side's tensor and block and the
    peer, and the peer logs it. Without the option the peer's memory holds the flipped bit."""
    p, port, bb = peer
    relay = FlipRelay(port, marker(2, 1, 6), "push")
    me = engine(integrity)
    try:
        assert me.link_llm_clusters([cluster(1, relay.port)], 5000) == [S.LLM_SUCCESS]
        src = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, bb]))
        for t in range(TENSORS):
            src.numpy(t)[:] = pattern(2, t, BLOCKS, bb)
        if integrity:
            with pytest.raises(kb.LLMException) as e:
                me.push_kv_blocks(src, kb.CacheIndex(1, p.info["alloc"]), [6], [2])
            print(f"\nchecked push: {e.value}")
            assert e.value.status_code == S.LLM_FAILED
            assert "CRC32C mismatch in tensor 1, block 6 " in str(e.value)
            assert "pushed to cache" in str(e.value) and "of cluster 1" in str(e.value)
            assert relay.line(10)["flipped"] > 0
            me.push_kv_blocks(src, kb.CacheIndex(1, p.info["alloc"]), [6], [2])  # unflipped now: lands
            assert np.array_equal(p.read("alloc", 1).reshape(BLOCKS, bb)[2], pattern(2, 1, BLOCKS, bb)[6])
        else:
            me.push_kv_blocks(src, kb.CacheIndex(1, p.info["alloc"]), [6], [2])
            assert relay.line(10)["flipped"] > 0
            got = p.read("alloc", 1).reshape(BLOCKS, bb)[2]
            assert one_bit_apart(got, pattern(2, 1, BLOCKS, bb)[6]), "the flipped bit did not arrive unnoticed"
        if integrity:  # the serving side logs it from a runtime thread: wait for it on its live stderr
            assert p.wait_stderr("CRC32C mismatch in a push from cluster 2 into cache"), p._stderr()
    finally:
        me.finalize()
        relay.close()
    p.close()


@pytest.mark.parametrize("op", ["pull", "push"])
def test_checked_transfers_move_the_right_bytes(op):
    """Contract: checked transfers of many segments (3000 (tensor, segment) pairs: three CRC blocks)
    and more bytes than one check batch (6 MiB) land exactly, both ways, between two processes."""
    blocks, bb = 3000, 2048
    port = free_port()
    p = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=blocks, block_bytes=bb)
    me = engine("crc32c")
    try:
        assert me.link_llm_clusters([cluster(1, port)], 5000) == [S.LLM_SUCCESS]
        mine = me.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [blocks, bb]))
        far, near = list(range(0, blocks, 2)), list(range(blocks // 2))  # far side not consecutive
        if op == "pull":
            me.pull_kv_blocks(kb.CacheIndex(1, p.info["reg"]), mine, far, near)
            for t in range(TENSORS):
                assert np.array_equal(mine.numpy(t)[:blocks // 2], pattern(1, t, blocks, bb)[far])
        else:
            for t in range(TENSORS):
                mine.numpy(t)[:] = pattern(2, t, blocks, bb)
            me.push_kv_blocks(mine, kb.CacheIndex(1, p.info["alloc"]), near, far)
            for t in range(TENSORS):
                got = p.read("alloc", t).reshape(blocks, bb)
                assert np.array_equal(got[far], pattern(2, t, blocks, bb)[near])
                assert np.array_equal(got[1::2], pattern(1, t, blocks, bb)[1::2])  # untouched
    finally:
        me.finalize()
        p.close()


def test_a_peer_that_cannot_check_is_refused_not_skipped():
    """Contract: a peer that does not offer CRC32C-checked transfers (capability 256: an older
    kvblocks) gets no request from an engine with the option: the transfer fails with
    LLM_FEATURE_NOT_ENABLED naming the option and the peer, and nothing is asked of the peer."""
    port = free_port()
    p = Peer(1, listen=f"127.0.0.1:{port}", tensors=TENSORS, blocks=BLOCKS, block_bytes=64,
             options={INTEGRITY: "crc32c"})
    table = struct.pack("<I", 1) + table_entry(5, num_tensors=TENSORS, tensor_bytes=BLOCKS * 64, num_blocks=BLOCKS)
    ctrl, _ = open_link(port, caps=CAP_TCP, table=table)  # CAP_TCP only
    try:
        r = p.call(op="pull", cluster=77, remote_cache=5, local="alloc", src=[0], dst=[0])
        assert r.get("status") == S.LLM_FEATURE_NOT_ENABLED, r
        assert "kvblocks.Integrity=crc32c: cluster 77 does not offer CRC32C-checked transfers" in r["error"]
        ctrl.settimeout(0.3)
        with pytest.raises(socket.timeout):
            recv_frame(ctrl)  # not even a request for a reverse channel
    finally:
        ctrl.close()
        p.close()


def test_option_values():
    """Contract: kvblocks.Integrity takes none or crc32c; crc32c with Transport=ucx (one-sided RMA,
    which no peer serves) is refused at initialize rather than left unchecked."""
    for value, ok in (("none", True), ("crc32c", True), ("CRC32C", False), ("adler", False), ("", False)):
        me = kb.LlmDataDist(9, kb.LlmRole.MIX)
        try:
            if ok:
                me.initialize({kb.OPTION_DEVICE_ID: "0", INTEGRITY: value})
            else:
                with pytest.raises(kb.LLMException) as e:
                    me.initialize({kb.OPTION_DEVICE_ID: "0", INTEGRITY: value})
                assert e.value.status_code == S.LLM_PARAM_INVALID
        finally:
            me.finalize()
    me = kb.LlmDataDist(9, kb.LlmRole.MIX)
    with pytest.raises(kb.LLMException) as e:
        me.initialize({kb.OPTION_DEVICE_ID: "0", INTEGRITY: "crc32c", kb.OPTION_TRANSPORT: "ucx",
                       kb.OPTION_UCX_TRUSTED_NETWORK: "1"})
    assert e.value.status_code == S.LLM_PARAM_INVALID and "needs a served path" in str(e.value)
    me.finalize()
