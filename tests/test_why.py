# SPDX-License-Identifier: Apache-2.0
"""Every failure says why, where an operator looks (README "Behaviour worth knowing"): a failed link
keeps its reason per cluster (link_failure) and logs it; unknown option keys and ignored options are
warned about; a 0 ms deadline is refused; the bound listen address is readable; runtime log lines,
from runtime threads too, reach logging.getLogger("kvblocks"). Peers are real second processes or
real sockets."""
import logging
import os
import re
import signal
import socket
import struct
import threading
import time

import pytest

import kvblocks as kb
from conftest import cluster, free_port, mix_engine
from hostile import ERROR, HDR, HELLO, MAGIC, VERSION, recv_frame, send_frame
from procs import Peer, wait_stopped

S = kb.Status


def _link(e, cid, port, timeout_ms=1000):
    return e.link_llm_clusters([cluster(cid, port)], timeout_ms)


def _records(caplog, text, timeout_s=5.0):
    """Messages of logger "kvblocks" holding `text`, waiting for the log pump (runtime threads)."""
    end = time.monotonic() + timeout_s
    while True:
        got = [r for r in caplog.records if r.name == "kvblocks" and text in r.getMessage()]
        if got or time.monotonic() > end:
            return got
        time.sleep(0.02)


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO, logger="kvblocks")
    return caplog


def test_refused_says_so(log):
    """Nothing listens on the port: LLM_LINK_FAILED (as before) with reason "refused", a message naming
    the address and ECONNREFUSED, and one warning in logging "kvblocks"."""
    e = mix_engine(2)
    port = free_port()
    try:
        assert _link(e, 1, port) == [S.LLM_LINK_FAILED]
        why = e.link_failure(1)
        assert why.reason == "refused" and why.status == S.LLM_LINK_FAILED
        assert f"connect 127.0.0.1:{port}: Connection refused" in why.message
        recs = _records(log, f"link to cluster 1 at 127.0.0.1:{port} failed (refused")
        assert recs and recs[0].levelno == logging.WARNING
        assert e.link_failure(3) is None  # never tried
    finally:
        e.finalize()


def test_timed_out_at_a_stopped_listener():
    """A listener that accepts (the kernel does) but never speaks, a SIGSTOPped peer: LLM_TIMEOUT,
    reason "timed_out", a message naming the missing CHALLENGE. Then it is linkable once resumed, and a
    success clears the record."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}")
    e = mix_engine(2)
    try:
        os.kill(peer.proc.pid, signal.SIGSTOP)
        wait_stopped(peer.proc.pid)
        assert _link(e, 1, port, 300) == [S.LLM_TIMEOUT]
        why = e.link_failure(1)
        assert why.reason == "timed_out" and why.status == S.LLM_TIMEOUT
        assert "sent no CHALLENGE before the link timeout" in why.message
        os.kill(peer.proc.pid, signal.SIGCONT)
        assert _link(e, 1, port, 5000) == [0]
        assert e.link_failure(1) is None
    finally:
        os.kill(peer.proc.pid, signal.SIGCONT)
        peer.close()
        e.finalize()


def test_auth_refused_both_sides(log):
    """Another kvblocks.AuthToken. The opener (a second process) gets reason "auth_refused"; the
    listener (this process) logs the refusal from a runtime thread into logging "kvblocks"."""
    port = free_port()
    me = mix_engine(1, port, **{kb.OPTION_AUTH_TOKEN: "right-token"})
    peer = Peer(2, auth="wrong-token")
    try:
        out = peer.call(op="link", cluster=1, ip="127.0.0.1", port=port)
        assert out["rets"] == [S.LLM_LINK_FAILED]
        reason, status, message = out["why"]
        assert reason == "auth_refused" and status == S.LLM_LINK_FAILED
        assert "did not prove knowledge of kvblocks.AuthToken" in message
        recs = _records(log, "rejected a link from cluster 2: wrong kvblocks.AuthToken proof")
        assert recs and recs[0].levelno == logging.WARNING
        assert recs[0].threadName == "kvblocks-log"  # it came from a runtime thread, through the pump
    finally:
        peer.close()
        me.finalize()


def test_auth_missing_here():
    """The listener requires a token and this engine has none: "auth_refused", saying so."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}", auth="t")
    e = mix_engine(2)
    try:
        assert _link(e, 1, port) == [S.LLM_LINK_FAILED]
        why = e.link_failure(1)
        assert why.reason == "auth_refused"
        assert "requires kvblocks.AuthToken and none is set" in why.message
    finally:
        peer.close()
        e.finalize()


def test_wrong_cluster_id():
    """Linking "cluster 999" at a listener that is cluster 1: "wrong_cluster_id", naming both."""
    port = free_port()
    peer = Peer(1, listen=f"127.0.0.1:{port}")
    e = mix_engine(2)
    try:
        assert _link(e, 999, port) == [S.LLM_LINK_FAILED]
        why = e.link_failure(999)
        assert why.reason == "wrong_cluster_id"
        assert f"127.0.0.1:{port} is cluster 1, not cluster 999" in why.message
    finally:
        peer.close()
        e.finalize()


def _old_listener():
    """A listener that answers a HELLO as a kvblocks listener of another protocol version does: an
    ERROR frame with LLM_PARAM_INVALID, then close."""
    ls = socket.create_server(("127.0.0.1", 0))

    def serve():
        c, _ = ls.accept()
        with c:
            recv_frame(c)
            send_frame(c, ERROR, status=S.LLM_PARAM_INVALID)
    threading.Thread(target=serve, daemon=True).start()
    return ls


def test_version_mismatch_opener():
    ls = _old_listener()
    e = mix_engine(2)
    try:
        assert _link(e, 1, ls.getsockname()[1]) == [S.LLM_LINK_FAILED]
        why = e.link_failure(1)
        assert why.reason == "version_mismatch"
        assert f"refused our HELLO (kvblocks protocol version {VERSION})" in why.message
    finally:
        ls.close()
        e.finalize()


def test_version_mismatch_listener_logs(log):
    """A HELLO of another protocol version: refused (as before) and logged, naming both versions."""
    port = free_port()
    me = mix_engine(1, port)
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            hello = struct.pack("<IIQ", VERSION + 1, 1, 77) + os.urandom(16)
            s.sendall(HDR.pack(MAGIC, HELLO, 0, 0, 0, len(hello)) + hello)
            assert recv_frame(s)[:2] == (ERROR, S.LLM_PARAM_INVALID)
        recs = _records(log, f"rejected a link from cluster 77: it speaks kvblocks protocol version {VERSION + 1}")
        assert recs and recs[0].levelno == logging.WARNING
    finally:
        me.finalize()


def test_limit_exceeded_here():
    """kvblocks.MaxLinks=1 and one link held: the next is refused with "limit_exceeded"."""
    p1, p2 = free_port(), free_port()
    a, b = Peer(1, listen=f"127.0.0.1:{p1}"), Peer(3, listen=f"127.0.0.1:{p2}")
    e = mix_engine(2, **{kb.OPTION_MAX_LINKS: "1"})
    try:
        assert _link(e, 1, p1) == [0]
        assert _link(e, 3, p2) == [S.LLM_CLUSTER_NUM_EXCEED_LIMIT]
        why = e.link_failure(3)
        assert why.reason == "limit_exceeded" and "kvblocks.MaxLinks" in why.message
    finally:
        a.close()
        b.close()
        e.finalize()


def test_unknown_option_key_warned_not_refused(log):
    e = kb.LlmDataDist(5, kb.LlmRole.MIX)
    try:
        e.initialize({kb.OPTION_DEVICE_ID: "0", "llm.ListenIPInfo": "127.0.0.1:0", "kvblocks.Trasnport": "tcp",
                      "other.Key": "1"})
        # Each line comes through the log pump (a runtime thread): wait for each, not only the first.
        assert _records(log, "unknown option llm.ListenIPInfo ignored: did you mean llm.ListenIpInfo?")
        assert _records(log, "unknown option kvblocks.Trasnport ignored: did you mean kvblocks.Transport?")
        assert not _records(log, "other.Key", timeout_s=0.2)  # not ours to judge
        assert e.listen_address is None  # the typo did not start a listener
    finally:
        e.finalize()


def test_every_option_key_is_known(log):
    """Contract: every kvblocks option the engine reads (each OPTION_* of ext_types.h, and each
    kb.OPTION_* constant Python exports) is in the known-keys table: none is warned about as unknown."""
    here = os.path.dirname(os.path.abspath(__file__))
    header = os.path.join(os.path.dirname(here), "include", "kvblocks", "ext_types.h")
    keys = {v for k, v in vars(kb).items() if k.startswith("OPTION_") and isinstance(v, str)}
    if os.path.isfile(header):  # a source checkout: the header is the one source
        with open(header) as f:
            keys |= set(re.findall(r'constexpr const char OPTION_\w+\[\] = "([^"]+)"', f.read()))
    assert "kvblocks.Encryption" in keys and "llm.ListenIpInfo" in keys
    e = kb.LlmDataDist(5, kb.LlmRole.MIX)
    try:
        # Every key at once, with values the engine may refuse: unknown keys are warned about first.
        e.initialize({k: "x" for k in keys} | {kb.OPTION_DEVICE_ID: "0"})
    except kb.LLMException:
        pass
    finally:
        e.finalize()
    unknown = [r.getMessage() for r in log.records if "unknown option" in r.getMessage()]
    assert not unknown, unknown


def test_second_initialize_names_ignored_options(log):
    """CANN: a second Initialize succeeds and ignores its options (spec 3.2); kvblocks warns, naming them."""
    e = mix_engine(5)
    try:
        e.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: "127.0.0.1:0"})
        assert e.listen_address is None
        assert _records(log, "initialized already, so these options were ignored: llm.ListenIpInfo=127.0.0.1:0")
    finally:
        e.finalize()


def test_zero_wait_time_refused():
    e = kb.LlmDataDist(5, kb.LlmRole.MIX)
    with pytest.raises(kb.ParamInvalidError) as ei:
        e.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_SYNC_CACHE_WAIT_TIME: "0"})
    assert ei.value.status_code == S.LLM_PARAM_INVALID
    assert 'llm.SyncKvCacheWaitTime="0": a 0 ms deadline fails every transfer' in str(ei.value)


def test_port_zero_is_readable_and_linkable():
    """ip:0: the kernel's port is readable here, and a second process links to it."""
    e = mix_engine(1, **{kb.OPTION_LISTEN_IP_INFO: "127.0.0.1:0"})
    peer = Peer(2, listen="127.0.0.1:0")
    try:
        addr = e.listen_address
        host, port = addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert peer.info["listen"].startswith("127.0.0.1:") and not peer.info["listen"].endswith(":0")
        assert peer.call(op="link", cluster=1, ip="127.0.0.1", port=int(port))["rets"] == [0]
    finally:
        peer.close()
        e.finalize()
    assert e.listen_address is None


def test_route_logs_back_to_stderr(capfd, log):
    """route_logs_to_python(False): lines go to stderr again, as C++ users get them."""
    kb.route_logs_to_python(False)
    try:
        e = kb.LlmDataDist(5, kb.LlmRole.MIX)
        e.initialize({kb.OPTION_DEVICE_ID: "0", "llm.DeviceID": "0"})
        e.finalize()
        assert "[kvblocks WARN pid=" in capfd.readouterr().err
        assert not [r for r in log.records if "llm.DeviceID" in r.getMessage()]
    finally:
        kb.route_logs_to_python(True)
