# SPDX-License-Identifier: Apache-2.0
"""kvblocks.Encryption=tls (README "Encryption"): TLS 1.3 on the control and data channels of TCP
links, keyed by kvblocks.AuthToken (PSK with an ephemeral ECDHE share) or by certificates. Every test
runs a real second process over real sockets; the relay tests put a recording byte relay
(tests/tap_relay.py) between the two, with the same relay in clear as the negative control."""
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import kvblocks as kb
from conftest import TIME_SCALE, cluster, free_port, mix_engine
from procs import Peer, wait_stopped

try:
    ctypes.CDLL("libssl.so.3")
except OSError:
    pytest.skip("libssl.so.3 (OpenSSL 3) cannot be loaded", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "tls-test-token"
TLS = {"kvblocks.Encryption": "tls"}
BLOCKS, BLOCK_BYTES, TENSORS = 16, 64 << 10, 2
MAGIC = bytes.fromhex("d1ce5a11c0ffee42")  # the block pattern the relay must never see


def logged(caplog, text, timeout_s=5.0):
    """Whether logger "kvblocks" got a line holding `text` (runtime lines arrive through a pump)."""
    end = time.monotonic() + timeout_s
    while not any(r.name == "kvblocks" and text in r.getMessage() for r in caplog.records):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def peer(cluster_id, port, tls=True, auth=TOKEN, **opts):
    options = dict(TLS if tls else {}, **opts)
    return Peer(cluster_id, listen=f"127.0.0.1:{port}", transport="tcp", tensors=TENSORS, blocks=BLOCKS,
                block_bytes=BLOCK_BYTES, wait_ms=5000, auth=auth, options=options)


def engine(cid, tls=True, auth=TOKEN, **opts):
    o = {kb.OPTION_TRANSPORT: "tcp", kb.OPTION_SYNC_CACHE_WAIT_TIME: "5000", **(TLS if tls else {}), **opts}
    if auth is not None:
        o[kb.OPTION_AUTH_TOKEN] = auth
    return mix_engine(cid, **o)


def local_cache(e, fill=0):
    c = e.allocate_cache(kb.CacheDesc(TENSORS, kb.DataType.DT_UINT8, [BLOCKS, BLOCK_BYTES]))
    for t in range(TENSORS):
        c.numpy(t)[:] = fill
    return c


def expected(p, t):
    """The peer's own pattern of tensor t (tests/peer.py pattern)."""
    sys.path.insert(0, HERE)
    from peer import pattern
    return pattern(p.cluster, t, BLOCKS, BLOCK_BYTES)


def test_encrypted_pull_push_async_move_the_right_bytes():
    port = free_port()
    p = peer(1, port)
    e = engine(2)
    try:
        assert e.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        assert e.link_path(1) == "tcp"
        mine = local_cache(e)
        idx = kb.CacheIndex(1, p.info["alloc"])
        e.pull_kv_blocks(idx, mine, list(range(BLOCKS)), list(range(BLOCKS)))
        for t in range(TENSORS):
            assert np.array_equal(mine.numpy(t), expected(p, t))
        # a small pipelined async pull and a large async one, then a push back
        for t in range(TENSORS):
            mine.numpy(t)[:] = 0
        handles = [e.pull_kv_blocks_async(idx, mine, [b], [b]) for b in range(BLOCKS)]
        for h in handles:
            h.wait()
        for t in range(TENSORS):
            assert np.array_equal(mine.numpy(t), expected(p, t))
        for t in range(TENSORS):
            mine.numpy(t)[:] = np.arange(BLOCKS * BLOCK_BYTES, dtype=np.uint64).astype(np.uint8).reshape(
                BLOCKS, BLOCK_BYTES) ^ (t + 1)
        e.push_kv_blocks_async(mine, idx, list(range(BLOCKS)), list(range(BLOCKS))).wait()
        e.push_kv_blocks(mine, idx, [0, 1], [0, 1])
        for t in range(TENSORS):
            assert np.array_equal(p.read("alloc", t), mine.numpy(t).reshape(-1))
    finally:
        e.finalize()
        p.close()


# A transfer of 20 MiB: over the stripe threshold (common/limits.h kStripeMinBytes, 2 MiB).
LARGE_TENSORS, LARGE_BLOCKS = 4, 80


def _channels(e, peer_id):
    return next(x for x in e.metrics()["peers"] if x["peer"] == peer_id)["data_channels"]


def _large_pair(wait_ms=5000):
    port = free_port()
    p = Peer(1, listen=f"127.0.0.1:{port}", transport="tcp", tensors=LARGE_TENSORS, blocks=LARGE_BLOCKS,
             block_bytes=BLOCK_BYTES, wait_ms=wait_ms, auth=TOKEN, options=TLS)
    e = engine(2, **{kb.OPTION_SYNC_CACHE_WAIT_TIME: str(wait_ms)})
    assert e.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
    mine = e.allocate_cache(kb.CacheDesc(LARGE_TENSORS, kb.DataType.DT_UINT8, [LARGE_BLOCKS, BLOCK_BYTES]))
    return p, e, mine


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="striping needs a second CPU for its copy thread")
def test_a_large_encrypted_transfer_is_striped_over_channels():
    """Contract: an encrypted transfer of 2 MiB or more goes over one channel per core (up to 4), its
    tensors split between them, and moves the right bytes both ways; small ones open no channel."""
    sys.path.insert(0, HERE)
    from peer import pattern

    p, e, mine = _large_pair()
    try:
        idx, blocks = kb.CacheIndex(1, p.info["alloc"]), list(range(LARGE_BLOCKS))
        e.pull_kv_blocks(idx, mine, [0], [0])  # 256 KiB: one channel, which the large pull's first stripe reuses
        e.pull_kv_blocks(idx, mine, [1], [1])
        before = _channels(e, 1)
        e.pull_kv_blocks(idx, mine, blocks, blocks)
        stripes = min(len(os.sched_getaffinity(0)), 4, LARGE_TENSORS)  # a stripe per copy-pool thread and the caller
        assert _channels(e, 1) == before + stripes - 1
        for t in range(LARGE_TENSORS):
            assert np.array_equal(mine.numpy(t), pattern(1, t, LARGE_BLOCKS, BLOCK_BYTES)), t
        for t in range(LARGE_TENSORS):
            mine.numpy(t)[:] ^= 0x5A
        e.push_kv_blocks(mine, idx, blocks, blocks)
        for t in range(LARGE_TENSORS):
            assert np.array_equal(p.read("alloc", t), mine.numpy(t).reshape(-1)), t
    finally:
        e.finalize()
        p.close()


def test_a_striped_pull_from_a_frozen_peer_keeps_its_deadline():
    """Contract: a striped encrypted pull from a peer frozen (SIGSTOP) before it answers fails with
    LLM_TIMEOUT within its deadline, every stripe stopped: no byte of the destination changes after
    the call returns, also once the peer runs again."""
    wait_ms = 1000
    p, e, mine = _large_pair(wait_ms)
    try:
        idx, blocks = kb.CacheIndex(1, p.info["alloc"]), list(range(LARGE_BLOCKS))
        e.pull_kv_blocks(idx, mine, [0], [0])  # the link works; its channel is open
        for t in range(LARGE_TENSORS):
            mine.numpy(t)[:] = 0xEE

        def digest():
            return hashlib.sha256(b"".join(bytes(mine.tensor(t)) for t in range(LARGE_TENSORS))).hexdigest()

        before = digest()
        os.kill(p.info["pid"], signal.SIGSTOP)
        wait_stopped(p.info["pid"])
        t0 = time.monotonic()
        with pytest.raises(kb.LLMTimeoutError):
            e.pull_kv_blocks(idx, mine, blocks, blocks)
        assert time.monotonic() - t0 <= wait_ms / 1000 + 0.1 * TIME_SCALE
        assert digest() == before
        os.kill(p.info["pid"], signal.SIGCONT)
        time.sleep(1.0)
        assert digest() == before
    finally:
        os.kill(p.info["pid"], signal.SIGCONT)
        e.finalize()
        p.close()


@pytest.mark.parametrize("tls_here", [True, False], ids=["tls-opener-plain-listener", "plain-opener-tls-listener"])
def test_a_peer_without_the_option_cannot_link(tls_here, caplog):
    port = free_port()
    p = peer(1, port, tls=not tls_here)
    e = engine(2, tls=tls_here)
    try:
        assert e.link_llm_clusters([cluster(1, port)], 3000) != [kb.Status.LLM_SUCCESS]
        why = e.link_failure(1)
        assert why.reason == "auth_refused" and "kvblocks.Encryption=tls" in why.message, why
        if tls_here:
            assert logged(caplog, "TLS handshake with 127.0.0.1:%d failed" % port)
            assert logged(caplog, "does not use kvblocks.Encryption=tls")
        else:
            assert logged(caplog, "the listener uses kvblocks.Encryption=tls and this engine does not")
            # the listener too
            assert p.wait_stderr("does not use kvblocks.Encryption=tls, and this engine does"), p._stderr()
    finally:
        e.finalize()
        p.close()


def test_a_peer_with_another_token_cannot_link(caplog):
    port = free_port()
    p = peer(1, port, auth="another-token")
    e = engine(2)
    try:
        assert e.link_llm_clusters([cluster(1, port)], 3000) == [kb.Status.LLM_LINK_FAILED]
        why = e.link_failure(1)
        assert why.reason == "auth_refused" and "another kvblocks.AuthToken" in why.message, why
        assert logged(caplog, "TLS handshake with 127.0.0.1:%d failed" % port)
        assert p.wait_stderr("TLS handshake with"), p._stderr()  # the listener logs its side too
    finally:
        e.finalize()
        p.close()


# ------------------------------------------------------------------ certificates
def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}", cwd=d)


def make_leaf(d, ca, name):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "1", "-out", f"{name}.pem", cwd=d)
    return {"kvblocks.TlsCertFile": os.path.join(d, f"{name}.pem"), "kvblocks.TlsKeyFile": os.path.join(d, f"{name}.key"),
            "kvblocks.TlsCaFile": os.path.join(d, f"{ca}.pem")}


@pytest.fixture(scope="module")
def certs():
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("no openssl command")
    with tempfile.TemporaryDirectory() as d:
        make_ca(d, "ca")
        make_ca(d, "rogue")
        yield {"a": make_leaf(d, "ca", "a"), "b": make_leaf(d, "ca", "b"), "rogue": make_leaf(d, "rogue", "r")}


def test_certificate_mode_links_and_refuses_another_ca(certs, caplog):
    port = free_port()
    p = peer(1, port, auth=None, **certs["a"])
    good = engine(2, auth=None, **certs["b"])
    rogue = engine(3, auth=None, **certs["rogue"])
    try:
        assert good.link_llm_clusters([cluster(1, port)]) == [kb.Status.LLM_SUCCESS]
        mine = local_cache(good)
        good.pull_kv_blocks(kb.CacheIndex(1, p.info["alloc"]), mine, [3, 4], [3, 4])
        assert np.array_equal(mine.numpy(1)[3:5], expected(p, 1)[3:5])
        assert rogue.link_llm_clusters([cluster(1, port)], 3000) == [kb.Status.LLM_LINK_FAILED]
        assert logged(caplog, "certificate verify failed")
    finally:
        good.finalize()
        rogue.finalize()
        p.close()


# ------------------------------------------------------------------ a relay in the middle
class Tap:
    def __init__(self, target, flip=None):
        self.capture = tempfile.NamedTemporaryFile(delete=False)
        argv = [sys.executable, os.path.join(HERE, "tap_relay.py"), "--target", str(target), "--capture",
                self.capture.name]
        if flip is not None:
            argv += ["--flip", str(flip)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.port = json.loads(self.proc.stdout.readline())["port"]

    def seen(self):
        with open(self.capture.name, "rb") as f:
            return f.read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        os.unlink(self.capture.name)


def fill_magic(p, e):
    """Our cache, every block the MAGIC pattern; pushed to the peer and pulled back through the relay."""
    mine = local_cache(e)
    for t in range(TENSORS):
        mine.numpy(t).reshape(-1).view(np.uint8)[:] = np.frombuffer(MAGIC * (BLOCKS * BLOCK_BYTES // 8), np.uint8)
    return mine


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "clear-control"])
def test_a_relay_sees_no_plaintext(tls, certs):
    # Certificates, no token: a token's proofs name the address dialled, and would refuse any relay.
    port = free_port()
    keys = (certs["a"], certs["b"]) if tls else ({}, {})
    p = peer(1, port, tls=tls, auth=None, **keys[0])
    tap = Tap(port)
    e = engine(2, tls=tls, auth=None, **keys[1])
    try:
        assert e.link_llm_clusters([cluster(1, tap.port)]) == [kb.Status.LLM_SUCCESS]
        idx = kb.CacheIndex(1, p.info["alloc"])
        mine = fill_magic(p, e)
        e.push_kv_blocks(mine, idx, list(range(BLOCKS)), list(range(BLOCKS)))
        back = local_cache(e)
        e.pull_kv_blocks(idx, back, list(range(BLOCKS)), list(range(BLOCKS)))
        assert np.array_equal(back.numpy(0), mine.numpy(0))
        seen = tap.seen()
        assert len(seen) > 2 * TENSORS * BLOCKS * BLOCK_BYTES  # everything went through the relay
        if tls:
            assert MAGIC[:6] not in seen
        else:
            assert seen.count(MAGIC) >= 2 * TENSORS * BLOCKS * BLOCK_BYTES // 8  # the control: in clear
    finally:
        e.finalize()
        p.close()
        tap.close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "clear-control"])
def test_a_relay_that_alters_a_byte_fails_the_transfer(tls, certs, caplog):
    port = free_port()
    keys = (certs["a"], certs["b"]) if tls else ({}, {})
    p = peer(1, port, tls=tls, auth=None, **keys[0])
    tap = Tap(port, flip=256 << 10)  # in the data of a pull's reply, past every handshake
    e = engine(2, tls=tls, auth=None, **keys[1])
    try:
        assert e.link_llm_clusters([cluster(1, tap.port)]) == [kb.Status.LLM_SUCCESS]
        idx = kb.CacheIndex(1, p.info["alloc"])
        mine = local_cache(e)
        if tls:
            with pytest.raises(kb.LLMException):
                e.pull_kv_blocks(idx, mine, list(range(BLOCKS)), list(range(BLOCKS)))
            assert logged(caplog, "bad record mac")
        else:
            e.pull_kv_blocks(idx, mine, list(range(BLOCKS)), list(range(BLOCKS)))
            got = np.concatenate([mine.numpy(t).reshape(-1) for t in range(TENSORS)])
            want = np.concatenate([expected(p, t).reshape(-1) for t in range(TENSORS)])
            assert (got != want).sum() == 1  # the control: in clear the altered byte is delivered
    finally:
        e.finalize()
        p.close()
        tap.close()


# ------------------------------------------------------------------ options
def test_tls_without_token_or_certificates_is_refused_at_initialize():
    e = kb.LlmDataDist(5, kb.LlmRole.MIX)
    with pytest.raises(kb.LLMException, match="needs kvblocks.AuthToken"):
        e.initialize({kb.OPTION_DEVICE_ID: "0", **TLS})
    with pytest.raises(kb.LLMException, match="use none or tls"):
        e.initialize({kb.OPTION_DEVICE_ID: "0", "kvblocks.Encryption": "ssl"})
    with pytest.raises(kb.LLMException, match="cannot be used with UCX"):
        e.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_AUTH_TOKEN: TOKEN, "kvblocks.UcxTrustedNetwork": "1",
                      **TLS})
    with pytest.raises(kb.LLMException, match="kvblocks.TlsCertFile"):
        e.initialize({kb.OPTION_DEVICE_ID: "0", **TLS, "kvblocks.TlsCertFile": "/nonexistent.pem",
                      "kvblocks.TlsKeyFile": "/nonexistent.key", "kvblocks.TlsCaFile": "/nonexistent-ca.pem"})


def test_missing_libssl_is_a_clear_error():
    code = ("import kvblocks as kb\n"
            "e = kb.LlmDataDist(5, kb.LlmRole.MIX)\n"
            "try:\n"
            "    e.initialize({kb.OPTION_DEVICE_ID: '0', kb.OPTION_AUTH_TOKEN: 't', 'kvblocks.Encryption': 'tls'})\n"
            "except kb.LLMException as x:\n"
            "    print('refused:', x)\n")
    env = dict(os.environ, KVBLOCKS_LIBSSL="libssl-absent.so.3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tempfile.gettempdir())  # not the checkout root, whose ./kvblocks may be unbuilt
    assert "refused:" in out.stdout and "cannot load libssl-absent.so.3 (OpenSSL 3)" in out.stdout, out


@pytest.mark.slow  # 4 attacker processes take both cores for the whole test
def test_a_connect_flood_never_refuses_a_real_tls_link():
    """As test_trust_bounds.py's flood test, with TLS: a TLS handshake the listener dropped from its
    pre-authentication slot is tried again, never a refused link."""
    from test_trust_bounds import _links_under_flood

    fails = _links_under_flood(50, 4, 250, 2000, options={**TLS, kb.OPTION_AUTH_TOKEN: TOKEN})
    assert not fails, fails[:5]
