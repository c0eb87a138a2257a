# SPDX-License-Identifier: Apache-2.0
"""kvblocks.hixl in one process: the numbered cases of the hixl spec (section 4), each test naming
the case(s) it covers. Engines S (server) and C (client) are real engines linked over loopback; the
transfer cases run on the in-process path and, with KVBLOCKS_TRANSPORT=tcp, over TCP."""
import ctypes
import socket
import threading
import time

import pytest

import kvblocks.hixl as hx
from ports import free_port

SIZE = 64 * 1024


def name(port):
    return f"127.0.0.1:{port}"


def buf(n, fill=None):
    b = (ctypes.c_uint8 * n)()
    if fill is not None:
        ctypes.memmove(b, bytes(fill(i) for i in range(n)) if callable(fill) else bytes([fill]) * n, n)
    return b


def addr(b):
    return ctypes.addressof(b)


class Fixture:
    """S listens, C listens too; each has a 64 KiB buffer registered as MEM_DEVICE before any link:
    S's holds i % 251, C's zeros."""

    def __init__(self, c_options=None):
        self.sname, self.cname = name(free_port()), name(free_port())
        self.s, self.c = hx.Hixl(), hx.Hixl()
        assert self.s.initialize(self.sname) == hx.SUCCESS
        assert self.c.initialize(self.cname, c_options or {}) == hx.SUCCESS
        self.sa, self.ca = buf(SIZE, lambda i: i % 251), buf(SIZE)
        st, self.sh = self.s.register_mem(hx.MemDesc(addr(self.sa), SIZE), hx.MEM_DEVICE)
        assert st == hx.SUCCESS and self.sh != 0
        st, self.ch = self.c.register_mem(hx.MemDesc(addr(self.ca), SIZE), hx.MEM_DEVICE)
        assert st == hx.SUCCESS and self.ch != 0

    def descs(self, offsets=(0, 8192, 16384), n=1024):
        return [hx.TransferOpDesc(addr(self.ca) + o, addr(self.sa) + o, n) for o in offsets]

    def keep(self, *bufs):
        """Holds buffers a test registered until the engines are finalized: registered memory must
        stay valid while it is registered."""
        self.kept = getattr(self, "kept", []) + list(bufs)
        return bufs[0] if len(bufs) == 1 else bufs

    def close(self):
        self.c.finalize()
        self.s.finalize()


@pytest.fixture(params=["auto", "tcp"])
def fx(request, monkeypatch):
    monkeypatch.setenv("KVBLOCKS_TRANSPORT", request.param)
    f = Fixture()
    yield f
    f.close()


@pytest.fixture
def linked(fx):
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    return fx


# ---------------------------------------------------------------- module and data classes
def test_h1_constants():
    """H1"""
    assert (hx.SUCCESS, hx.PARAM_INVALID, hx.TIMEOUT, hx.NOT_CONNECTED, hx.ALREADY_CONNECTED, hx.NOTIFY_FAILED,
            hx.UNSUPPORTED, hx.FAILED, hx.RESOURCE_EXHAUSTED) == (0, 103900, 103901, 103902, 103903, 103904,
                                                                 103905, 503900, 203900)
    assert all(type(x) is int for x in (hx.SUCCESS, hx.TIMEOUT, hx.FAILED))
    assert hx.FEATURE_SUPPORTED == 1 and hx.FEATURE_NOT_SUPPORTED == 0
    assert (hx.OPTION_ENABLE_USE_FABRIC_MEM, hx.OPTION_RDMA_TRAFFIC_CLASS, hx.OPTION_RDMA_SERVICE_LEVEL,
            hx.OPTION_BUFFER_POOL, hx.OPTION_GLOBAL_RESOURCE_CONFIG, hx.OPTION_AUTO_CONNECT,
            hx.OPTION_LOCAL_COMM_RES) == ("EnableUseFabricMem", "RdmaTrafficClass", "RdmaServiceLevel", "BufferPool",
                                          "GlobalResourceConfig", "AutoConnect", "LocalCommRes")
    assert sorted(hx.__all__) == sorted(set(hx.__all__)) and all(hasattr(hx, n) for n in hx.__all__)


def test_h2_enums():
    """H2"""
    assert [int(x) for x in (hx.MemType.MEM_DEVICE, hx.MemType.MEM_HOST)] == [0, 1]
    assert [int(x) for x in (hx.TransferOp.READ, hx.TransferOp.WRITE)] == [0, 1]
    assert [int(x) for x in hx.TransferStatus] == [0, 1, 2, 3]
    assert [int(x) for x in hx.AsyncConnectStatus] == list(range(7))
    assert [int(x) for x in hx.FeatureType] == [0, 1]
    assert hx.MEM_HOST == 1 and hx.WRITE == 1 and hx.CLIENT_SERVER_COMM == 1
    assert hx.TransferStatus.COMPLETED.name == "COMPLETED" and hash(hx.CONNECTED) == hash(hx.CONNECTED)


def test_h3_defaults():
    """H3"""
    a = hx.GetTransferStatusArgs()
    assert a.max_query_count == 4294967295 and a.skip_waiting is False
    assert hx.TransferArgs().user_data == 0
    r = hx.TransferResult()
    assert (r.req, r.user_data, r.status) == (0, 0, hx.TransferStatus.WAITING)
    with pytest.raises(AttributeError):
        r.status = hx.TransferStatus.COMPLETED


def test_h4_data_classes_round_trip():
    """H4"""
    m = hx.MemDesc(addr=0x1000, len=8192)
    assert (m.addr, m.len) == (0x1000, 8192)
    m.addr, m.len = 0x2000, 1
    assert (m.addr, m.len) == (0x2000, 1)
    d = hx.TransferOpDesc(1, 2, 3)
    d.local_addr, d.remote_addr, d.len = 4, 5, 6
    assert (d.local_addr, d.remote_addr, d.len) == (4, 5, 6)
    n = hx.NotifyDesc("a", "b")
    n.name, n.notify_msg = "c", "d"
    assert (n.name, n.notify_msg) == ("c", "d")
    with pytest.raises((TypeError, OverflowError)):
        hx.MemDesc(-1, 1)
    with pytest.raises(TypeError):
        hx.TransferOpDesc("x", 1, 1)
    e = hx.Hixl()
    with pytest.raises(TypeError):
        e.register_mem(hx.MemDesc(0x1000, 1), 2)  # only MemType values convert
    with pytest.raises(TypeError):
        e.transfer_sync("127.0.0.1:1", 5, [])
    with pytest.raises(TypeError):
        e.transfer_sync("127.0.0.1:1", hx.READ, [hx.MemDesc(1, 1)])


def test_h5_get_capability():
    """H5"""
    assert hx.get_capability(hx.AUTO_CONNECT) == (hx.SUCCESS, 1)
    assert hx.get_capability(hx.CLIENT_SERVER_COMM) == (hx.SUCCESS, 1)
    assert hx.get_capability(7) == (hx.SUCCESS, 0)
    assert hx.get_capability(-1) == (hx.PARAM_INVALID, 0)


# ---------------------------------------------------------------- lifecycle
def test_h6_initialize_twice_finalize_twice():
    """H6"""
    e = hx.Hixl()
    assert e.initialize("127.0.0.1:0") == hx.SUCCESS
    assert e.initialize("127.0.0.1:0") == hx.SUCCESS
    assert e.finalize() is None
    e.finalize()
    assert e.initialize("127.0.0.1:0") == hx.SUCCESS  # usable again
    e.finalize()


def _assert_uninitialized(e):
    assert e.connect("127.0.0.1:1") == hx.FAILED
    assert e.register_mem(hx.MemDesc(0x1000, 10), hx.MEM_HOST) == (hx.FAILED, 0)
    assert e.get_notifies() == (hx.FAILED, [])
    assert e.get_all_transfer_status() == (hx.FAILED, [])
    assert e.get_all_async_connect_status() == (hx.FAILED, {})
    assert e.get_transfer_status(0) == (hx.FAILED, hx.TransferStatus.FAILED)
    assert e.get_async_connect_status("127.0.0.1:1") == (hx.FAILED, hx.NOT_CONNECT)
    assert e.transfer_sync("127.0.0.1:1", hx.READ, []) == hx.FAILED
    assert e.transfer_async("127.0.0.1:1", hx.READ, []) == (hx.FAILED, 0)
    assert e.send_notify("127.0.0.1:1", hx.NotifyDesc("a", "b")) == hx.FAILED
    assert e.deregister_mem(1) == hx.FAILED


def test_h7_never_initialized():
    """H7"""
    _assert_uninitialized(hx.Hixl())


def test_h8_after_finalize():
    """H8"""
    e = hx.Hixl()
    assert e.initialize("127.0.0.1:0") == hx.SUCCESS
    e.finalize()
    _assert_uninitialized(e)


@pytest.mark.parametrize("options", [
    {"AutoConnect": "2"}, {"AutoConnect": ""}, {"NoSuchKey": "1"}, {"RdmaTrafficClass": "130"},
    {"RdmaServiceLevel": "8"}, {"GlobalResourceConfig": "not json"},
    {"GlobalResourceConfig": '{"connect_pool.thread_num":"65"}'},
    {"GlobalResourceConfig": '{"channel_pool.high_waterline":"0.5"}'},
    {"BufferPool": "4"}, {"EnableUseFabricMem": "2"}, {"LocalCommRes": "{"},
])
def test_h9_bad_options(options):
    """H9"""
    e = hx.Hixl()
    assert e.initialize("127.0.0.1:0", options) == hx.PARAM_INVALID
    assert e.connect("127.0.0.1:1") == hx.FAILED  # a failed initialize leaves it uninitialized
    e.finalize()


def test_h9_good_options():
    """H9"""
    e = hx.Hixl()
    cfg = ('{"connect_pool.thread_num":"4","channel_pool.high_waterline":0.8,"channel_pool.low_waterline":"0.4",'
           '"comm_resource_config.protocol_desc":["roce:device"],"fabric_memory.max_capacity":32}')
    assert e.initialize("127.0.0.1:0", {"RdmaTrafficClass": "132", "AutoConnect": "1", "BufferPool": "4:8",
                                        "adxl.RdmaServiceLevel": "4", "GlobalResourceConfig": cfg,
                                        "LocalCommRes": '{"version":"1.3"}'}) == hx.SUCCESS
    e.finalize()


def test_h10_names_and_ports():
    """H10"""
    e = hx.Hixl()
    assert e.initialize("localhost:1234") == hx.PARAM_INVALID
    assert e.initialize("127.0.0.1:http") == hx.PARAM_INVALID
    assert e.initialize("[::1]:0") == hx.SUCCESS
    e.finalize()
    port = free_port()
    a, b = hx.Hixl(), hx.Hixl()
    assert a.initialize(name(port)) == hx.SUCCESS
    assert b.initialize(name(port)) == hx.FAILED
    a.finalize()
    b.finalize()


# ---------------------------------------------------------------- memory registration
def test_h11_to_h15_registration():
    """H11, H12, H13, H14, H15"""
    e = hx.Hixl()
    assert e.initialize("127.0.0.1:0") == hx.SUCCESS
    b = buf(SIZE)
    x = addr(b)
    st, h = e.register_mem(hx.MemDesc(x, SIZE), hx.MEM_DEVICE)  # H11
    assert st == hx.SUCCESS and h != 0
    assert e.deregister_mem(h) == hx.SUCCESS
    assert e.deregister_mem(h) == hx.SUCCESS
    assert e.register_mem(hx.MemDesc(0, 4096), hx.MEM_HOST) == (hx.PARAM_INVALID, 0)  # H12
    assert e.register_mem(hx.MemDesc(x, 0), hx.MEM_HOST) == (hx.PARAM_INVALID, 0)
    assert e.register_mem(hx.MemDesc(2 ** 64 - 16, 32), hx.MEM_HOST) == (hx.PARAM_INVALID, 0)
    st1, h1 = e.register_mem(hx.MemDesc(x, 8192), hx.MEM_HOST)  # H13
    st2, h2 = e.register_mem(hx.MemDesc(x, 8192), hx.MEM_HOST)
    assert st1 == st2 == hx.SUCCESS and h1 == h2 != 0
    assert e.register_mem(hx.MemDesc(x + 4096, 8192), hx.MEM_HOST)[0] == hx.PARAM_INVALID  # H14
    st, h3 = e.register_mem(hx.MemDesc(x + 4096, 8192), hx.MEM_DEVICE)
    assert st == hx.SUCCESS and h3 not in (0, h1)
    assert e.deregister_mem(0) == hx.PARAM_INVALID  # H15
    assert e.deregister_mem(0xdead) == hx.SUCCESS
    e.finalize()


def test_h16_deregister_needs_no_links(fx):
    """H16"""
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.deregister_mem(fx.ch) == hx.FAILED
    assert fx.c.disconnect(fx.sname) == hx.SUCCESS
    assert fx.c.deregister_mem(fx.ch) == hx.SUCCESS


# ---------------------------------------------------------------- links
def test_h17_connect_disconnect(fx):
    """H17"""
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.connect(fx.sname) == hx.ALREADY_CONNECTED
    assert fx.c.disconnect(fx.sname) == hx.SUCCESS
    assert fx.c.disconnect(fx.sname) == hx.NOT_CONNECTED


def test_h18_bad_connect_arguments(fx):
    """H18"""
    assert fx.c.connect(fx.cname) == hx.PARAM_INVALID
    assert fx.c.connect(fx.sname, 0) == hx.PARAM_INVALID
    assert fx.c.disconnect(fx.sname, -1) == hx.PARAM_INVALID


def test_h19_unreachable(fx):
    """H19"""
    assert fx.c.connect(name(free_port())) == hx.FAILED
    assert fx.c.connect("127.0.0.1:0") == hx.FAILED
    assert fx.c.connect("bad.ip:1") == hx.PARAM_INVALID


def _poll_state(e, remote, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        st, s = e.get_async_connect_status(remote)
        assert st == hx.SUCCESS
        if s == want or time.monotonic() > deadline:
            return s
        time.sleep(0.005)


def test_h20_h22_connect_async(fx):
    """H20, H22"""
    assert fx.c.connect_async(fx.sname) == hx.SUCCESS
    st, s = fx.c.get_async_connect_status(fx.sname)
    assert st == hx.SUCCESS and s in (hx.CONNECT_PENDING, hx.CONNECTING, hx.CONNECTED)
    assert _poll_state(fx.c, fx.sname, hx.CONNECTED, 2.0) == hx.CONNECTED
    assert fx.c.get_all_async_connect_status() == (hx.SUCCESS, {fx.sname: hx.CONNECTED})
    assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()) == hx.SUCCESS
    assert fx.c.disconnect_async(fx.sname) == hx.SUCCESS  # H22
    assert _poll_state(fx.c, fx.sname, hx.NOT_CONNECT) == hx.NOT_CONNECT
    assert fx.sname not in fx.c.get_all_async_connect_status()[1]
    assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()) == hx.NOT_CONNECTED


def test_h21_connect_async_fails(fx):
    """H21"""
    target = name(free_port())
    assert fx.c.connect_async(target) == hx.SUCCESS
    assert _poll_state(fx.c, target, hx.CONNECT_FAILED) == hx.CONNECT_FAILED


def test_h23_status_of_unknown_and_sync(fx):
    """H23"""
    assert fx.c.get_async_connect_status("10.0.0.1:1") == (hx.SUCCESS, hx.NOT_CONNECT)
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.get_async_connect_status(fx.sname) == (hx.SUCCESS, hx.NOT_CONNECT)


def test_h24_connect_queue_capacity():
    """H24"""
    listeners = []
    for _ in range(3):  # accept nothing and never answer a handshake
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        listeners.append(s)
    e = hx.Hixl()
    cfg = '{"connect_pool.thread_num":"1","connect_pool.task_queue_capacity":"1"}'
    assert e.initialize(name(free_port()), {"GlobalResourceConfig": cfg}) == hx.SUCCESS
    try:
        results = [e.connect_async(name(s.getsockname()[1]), 500) for s in listeners]
        assert results[0] == hx.SUCCESS and hx.RESOURCE_EXHAUSTED in results[1:], results
        assert e.connect_async(name(listeners[0].getsockname()[1]), 0) == hx.PARAM_INVALID
    finally:
        e.finalize()
        for s in listeners:
            s.close()


def test_h25_disconnect_async_follows_connect_async(fx):
    """H25"""
    assert fx.c.connect_async(fx.sname) == hx.SUCCESS
    assert fx.c.disconnect_async(fx.sname) == hx.SUCCESS
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        s = fx.c.get_async_connect_status(fx.sname)[1]
        seen.append(s)
        if s == hx.NOT_CONNECT:
            break
        time.sleep(0.001)
    assert seen[0] in (hx.DISCONNECT_PENDING, hx.DISCONNECTING, hx.NOT_CONNECT), seen
    assert hx.CONNECTED not in seen and seen[-1] == hx.NOT_CONNECT, seen


# ---------------------------------------------------------------- synchronous transfer
def _expect(fx, offsets, n=1024):
    want = bytearray(SIZE)
    for o in offsets:
        want[o:o + n] = bytes(fx.sa)[o:o + n]
    return bytes(want)


def test_h26_read(linked):
    """H26"""
    fx = linked
    assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()) == hx.SUCCESS
    assert bytes(fx.ca) == _expect(fx, (0, 8192, 16384))


def test_h27_write(linked):
    """H27"""
    fx = linked
    ctypes.memset(fx.ca, 0x5A, SIZE)
    before = bytes(fx.sa)
    assert fx.c.transfer_sync(fx.sname, hx.WRITE, fx.descs()) == hx.SUCCESS
    want = bytearray(before)
    for o in (0, 8192, 16384):
        want[o:o + 1024] = b"\x5a" * 1024
    assert bytes(fx.sa) == bytes(want)


def test_h28_not_connected(fx):
    """H28"""
    assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()) == hx.NOT_CONNECTED
    assert bytes(fx.ca) == bytes(SIZE)


def test_h29_auto_connect(monkeypatch):
    """H29"""
    f = Fixture({"AutoConnect": "1"})
    try:
        assert f.c.transfer_sync(f.sname, hx.READ, f.descs()) == hx.SUCCESS
        assert bytes(f.ca) == _expect(f, (0, 8192, 16384))
        assert f.c.connect(f.sname) == hx.ALREADY_CONNECTED
        assert f.c.send_notify(name(free_port()), hx.NotifyDesc("a", "b")) == hx.NOT_CONNECTED  # H42 (auto on)
    finally:
        f.close()


def test_h30_bad_descs(fx):
    """H30"""
    bad = [hx.TransferOpDesc(0, addr(fx.sa), 16)]
    assert fx.c.transfer_sync(fx.sname, hx.READ, bad) == hx.PARAM_INVALID  # unlinked: checked first
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.transfer_sync(fx.sname, hx.READ, bad) == hx.PARAM_INVALID
    assert fx.c.transfer_sync(fx.sname, hx.READ, [hx.TransferOpDesc(addr(fx.ca), 0, 16)]) == hx.PARAM_INVALID
    assert fx.c.transfer_sync(fx.sname, hx.READ, []) == hx.PARAM_INVALID
    assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs(n=0)) == hx.PARAM_INVALID
    assert bytes(fx.ca) == bytes(SIZE)


def test_h31_hostile_ranges(linked):
    """H31 (and hostile ranges: out-of-region, length overflow, unregistered remote)"""
    fx = linked
    c, s = addr(fx.ca), addr(fx.sa)
    before_s = bytes(fx.sa)
    cases = [
        [hx.TransferOpDesc(c + SIZE - 1023, s, 1024)],       # local exceeds C's registration by 1 byte
        [hx.TransferOpDesc(c, s + SIZE - 1023, 1024)],       # remote exceeds S's registration by 1 byte
        [hx.TransferOpDesc(c, s + 10 * SIZE, 16)],           # remote outside every registration
        [hx.TransferOpDesc(c, s - 16, 32)],                  # starts before the remote region
        [hx.TransferOpDesc(c, s, 2 ** 64 - 8)],              # length overflows the address space
        [hx.TransferOpDesc(c, 2 ** 64 - 8, 16)],             # remote address + len overflows
        [hx.TransferOpDesc(c, s, 16), hx.TransferOpDesc(c, s + SIZE, 16)],  # the bad one is second
    ]
    for op in (hx.READ, hx.WRITE):
        for d in cases:
            assert fx.c.transfer_sync(fx.sname, op, d) == hx.PARAM_INVALID, (op, d)
    assert bytes(fx.ca) == bytes(SIZE) and bytes(fx.sa) == before_s  # nothing moved


def test_h32_adjacent_registrations(fx):
    """H32"""
    x = fx.keep(buf(8192, lambda i: (i * 7) % 256))
    assert fx.s.register_mem(hx.MemDesc(addr(x), 4096), hx.MEM_DEVICE)[0] == hx.SUCCESS
    assert fx.s.register_mem(hx.MemDesc(addr(x) + 4096, 4096), hx.MEM_HOST)[0] == hx.SUCCESS
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    d = [hx.TransferOpDesc(addr(fx.ca) + 2048, addr(x) + 2048, 4096)]
    assert fx.c.transfer_sync(fx.sname, hx.READ, d) == hx.SUCCESS
    assert bytes(fx.ca)[2048:6144] == bytes(x)[2048:6144]
    # and on the local side: C's 64 KiB buffer split in two registrations
    y = fx.keep(buf(8192))
    assert fx.c.disconnect(fx.sname) == hx.SUCCESS
    assert fx.c.register_mem(hx.MemDesc(addr(y), 4096), hx.MEM_HOST)[0] == hx.SUCCESS
    assert fx.c.register_mem(hx.MemDesc(addr(y) + 4096, 4096), hx.MEM_HOST)[0] == hx.SUCCESS
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.transfer_sync(fx.sname, hx.READ, [hx.TransferOpDesc(addr(y) + 1000, addr(x) + 3000, 5000)]) == 0
    assert bytes(y)[1000:6000] == bytes(x)[3000:8000]


def test_h33_registered_after_connect(linked):
    """H33"""
    fx = linked
    late = fx.keep(buf(4096, 0x33))
    assert fx.s.register_mem(hx.MemDesc(addr(late), 4096), hx.MEM_DEVICE)[0] == hx.SUCCESS
    d = [hx.TransferOpDesc(addr(fx.ca), addr(late), 4096)]
    assert fx.c.transfer_sync(fx.sname, hx.READ, d) == hx.PARAM_INVALID
    assert fx.c.disconnect(fx.sname) == hx.SUCCESS
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.transfer_sync(fx.sname, hx.READ, d) == hx.SUCCESS
    assert bytes(fx.ca)[:4096] == b"\x33" * 4096


def test_h34_zero_timeout(linked):
    """H34"""
    assert linked.c.transfer_sync(linked.sname, hx.READ, linked.descs(), timeout_in_millis=0) == hx.PARAM_INVALID


# ---------------------------------------------------------------- asynchronous transfer
def _finish(e, req, timeout=5.0):
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st, s = e.get_transfer_status(req)
        assert st == hx.SUCCESS
        seen.append(s)
        if s != hx.TransferStatus.WAITING:
            return seen
        time.sleep(0.001)
    return seen


def test_h35_async_read(linked):
    """H35"""
    fx = linked
    st, req = fx.c.transfer_async(fx.sname, hx.READ, fx.descs())
    assert st == hx.SUCCESS and req != 0
    seen = _finish(fx.c, req)
    assert seen[-1] == hx.TransferStatus.COMPLETED and all(s == hx.TransferStatus.WAITING for s in seen[:-1])
    assert bytes(fx.ca) == _expect(fx, (0, 8192, 16384))
    assert fx.c.get_transfer_status(req) == (hx.PARAM_INVALID, hx.TransferStatus.FAILED)


def test_h36_async_errors(fx):
    """H36"""
    assert fx.c.transfer_async(fx.sname, hx.READ, fx.descs()) == (hx.NOT_CONNECTED, 0)
    assert fx.c.get_transfer_status(12345) == (hx.PARAM_INVALID, hx.TransferStatus.FAILED)
    assert fx.c.get_transfer_status(0) == (hx.FAILED, hx.TransferStatus.FAILED)


def _submit3(fx):
    reqs = []
    for ud, off in ((11, 0), (22, 8192), (33, 16384)):
        a = hx.TransferArgs()
        a.user_data = ud
        st, req = fx.c.transfer_async(fx.sname, hx.READ, fx.descs((off,)), a)
        assert st == hx.SUCCESS
        reqs.append(req)
    time.sleep(0.2)  # let them finish (they are tiny)
    return reqs


def test_h37_all_status(linked):
    """H37"""
    fx = linked
    reqs = _submit3(fx)
    st, res = fx.c.get_all_transfer_status()
    assert st == hx.SUCCESS
    assert [r.req for r in res] == reqs and [r.user_data for r in res] == [11, 22, 33]
    assert all(r.status == hx.TransferStatus.COMPLETED for r in res)
    assert fx.c.get_all_transfer_status() == (hx.SUCCESS, [])


def test_h38_max_query_count(linked):
    """H38"""
    fx = linked
    reqs = _submit3(fx)
    assert fx.c.get_all_transfer_status(hx.GetTransferStatusArgs(max_query_count=0)) == (hx.SUCCESS, [])
    st, res = fx.c.get_all_transfer_status(hx.GetTransferStatusArgs(max_query_count=2))
    assert st == hx.SUCCESS and [r.req for r in res] == reqs[:2]
    st, res = fx.c.get_all_transfer_status()
    assert [r.req for r in res] == reqs[2:]


def test_h40_disconnect_forgets_requests(linked):
    """H40"""
    fx = linked
    st, req = fx.c.transfer_async(fx.sname, hx.READ, fx.descs())
    assert st == hx.SUCCESS
    assert fx.c.disconnect(fx.sname) == hx.SUCCESS
    assert fx.c.get_transfer_status(req) == (hx.PARAM_INVALID, hx.TransferStatus.FAILED)


# ---------------------------------------------------------------- notify
def test_h41_notifies_in_order(linked):
    """H41"""
    fx = linked
    assert fx.s.get_notifies() == (hx.SUCCESS, [])
    for msg in ("block_0", "m1", "m2"):
        assert fx.c.send_notify(fx.sname, hx.NotifyDesc("cache_ready", msg)) == hx.SUCCESS
    st, got = fx.s.get_notifies()
    assert st == hx.SUCCESS and [(n.name, n.notify_msg) for n in got] == [("cache_ready", "block_0"),
                                                                         ("cache_ready", "m1"), ("cache_ready", "m2")]
    assert fx.s.get_notifies() == (hx.SUCCESS, [])


def test_h42_notify_limits(fx):
    """H42"""
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("n", "m")) == hx.NOT_CONNECTED
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("x" * 1025, "m")) == hx.PARAM_INVALID
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("n", "y" * 1025)) == hx.PARAM_INVALID
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("é" * 513, "m")) == hx.PARAM_INVALID  # 1026 UTF-8 bytes
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("x" * 1024, "y" * 1024)) == hx.SUCCESS
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("n", "m"), 0) == hx.PARAM_INVALID
    st, got = fx.s.get_notifies()
    assert [(len(n.name), len(n.notify_msg)) for n in got] == [(1024, 1024)]


def test_h43_notify_queue_cap(linked):
    """H43"""
    fx = linked
    for i in range(4096):
        assert fx.c.send_notify(fx.sname, hx.NotifyDesc("n", str(i))) == hx.SUCCESS
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("n", "over")) == hx.RESOURCE_EXHAUSTED
    st, got = fx.s.get_notifies()
    assert st == hx.SUCCESS and len(got) == 4096 and got[-1].notify_msg == "4095"
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("n", "again")) == hx.SUCCESS
    assert [n.notify_msg for n in fx.s.get_notifies()[1]] == ["again"]


def test_notify_follows_async_transfers(linked):
    """Ordering (H41/§1.13, kvblocks): a notify sent right after transfer_async is received only
    after that transfer's bytes are in place."""
    fx = linked
    big = 1 << 20
    src, dst = fx.keep(buf(big, 0x77), buf(big))
    fx.c.disconnect(fx.sname)
    assert fx.c.register_mem(hx.MemDesc(addr(src), big), hx.MEM_HOST)[0] == hx.SUCCESS
    assert fx.s.register_mem(hx.MemDesc(addr(dst), big), hx.MEM_HOST)[0] == hx.SUCCESS
    assert fx.c.connect(fx.sname) == hx.SUCCESS
    descs = [hx.TransferOpDesc(addr(src) + o, addr(dst) + o, 4096) for o in range(0, big, 8192)]
    st, req = fx.c.transfer_async(fx.sname, hx.WRITE, descs)
    assert st == hx.SUCCESS
    assert fx.c.send_notify(fx.sname, hx.NotifyDesc("done", "x")) == hx.SUCCESS
    assert len(fx.s.get_notifies()[1]) == 1
    view = bytes(dst)
    assert all(view[o:o + 4096] == b"\x77" * 4096 for o in range(0, big, 8192))


# ---------------------------------------------------------------- threads
def test_h45_threads_and_racing_finalize(linked):
    """H45"""
    fx = linked
    ctypes.memset(fx.ca, 0, SIZE)
    errors = []

    def worker(k):
        off = k * 8192
        for _ in range(50):
            st = fx.c.transfer_sync(fx.sname, hx.READ, [hx.TransferOpDesc(addr(fx.ca) + off, addr(fx.sa) + off, 8192)])
            if st != hx.SUCCESS:
                errors.append(st)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == [] and bytes(fx.ca) == bytes(fx.sa)
    # finalize racing with transfers: it returns after them, and later calls fail
    results = []

    def racer():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            results.append(fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()))
            if results[-1] != hx.SUCCESS:
                return

    ts = [threading.Thread(target=racer) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.05)
    fx.c.finalize()
    for t in ts:
        t.join()
    assert set(results) == {hx.SUCCESS, hx.FAILED}, set(results)
    assert fx.c.transfer_sync(fx.sname, hx.READ, fx.descs()) == hx.FAILED
