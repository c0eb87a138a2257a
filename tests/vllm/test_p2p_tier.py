# SPDX-License-Identifier: Apache-2.0
"""kvblocks as vLLM's P2P tier DataTransport, driven through vLLM's interface as the P2P session drives it.

Two real kvblocks engines in two processes: this one (the writer, as vLLM's serving session) and
tests/vllm/p2p_peer.py, whose block region is a file mapping this test reads directly, so what lands
in the peer's memory is seen even while the peer is stopped or dead.
"""
import ctypes
import importlib.util
import json
import mmap
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.vllm
HERE = os.path.dirname(os.path.abspath(__file__))

# The peers fork from one process that imports vLLM once (5-20 s here); it starts before this process
# imports vLLM itself, so the two imports overlap.
ZYGOTE = None
if importlib.util.find_spec("vllm") is not None:
    ZYGOTE = subprocess.Popen([sys.executable, os.path.join(HERE, "p2p_peer.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
try:
    import vllm.v1.kv_offload.tiering.p2p.data.base  # noqa: F401
except ImportError as e:  # vLLM missing or broken (kvblocks' own module must import: no skip for it)
    if ZYGOTE is not None:
        ZYGOTE.kill()
    pytest.skip(f"vLLM's P2P tier is not importable: {e}", allow_module_level=True)
from kvblocks.vllm.p2p_tier import KvblocksTransport  # noqa: E402

TOKEN = "p2p-tier-test-token"
NB, BL = 16, 64 * 1024  # 16 blocks of 64 KiB: 1 MiB per region
START_S = 60.0


def _readline(f, timeout, what):
    r, _, _ = select.select([f], [], [], timeout)
    line = f.readline() if r else ""
    assert line, f"{what} gave no reply within {timeout} s"
    return line


@pytest.fixture(scope="module", autouse=True)
def zygote():
    assert _readline(ZYGOTE.stdout, START_S, "the peer zygote").strip() == "ready"
    yield ZYGOTE
    ZYGOTE.kill()
    ZYGOTE.wait()


class PeerProc:
    """A KvblocksTransport in a second process (forked by tests/vllm/p2p_peer.py), its region mapped here."""

    def __init__(self, tmp, transport="tcp", timeout_ms=1000, token=TOKEN):
        self.region_path, self.canary_path = str(tmp / "region"), str(tmp / "canary")
        with open(self.region_path, "wb") as f:
            f.truncate(NB * BL)
        with open(self.canary_path, "wb") as f:
            f.write(b"\xaa" * BL)
        cmd_fifo, reply_fifo = str(tmp / "cmd"), str(tmp / "reply")
        os.mkfifo(cmd_fifo)
        os.mkfifo(reply_fifo)
        req = {"cmd_fifo": cmd_fifo, "reply_fifo": reply_fifo, "region": self.region_path, "canary": self.canary_path,
               "num_blocks": NB, "block_len": BL, "token": token, "transport": transport, "timeout_ms": timeout_ms}
        rfd = os.open(reply_fifo, os.O_RDONLY | os.O_NONBLOCK)
        ZYGOTE.stdin.write(json.dumps(req) + "\n")
        ZYGOTE.stdin.flush()
        self._cmd = self._open_writer(cmd_fifo)
        os.set_blocking(rfd, True)
        self._out = os.fdopen(rfd)
        self.info = json.loads(_readline(self._out, START_S, "the p2p peer"))
        self.pid, self.meta = self.info["pid"], bytes.fromhex(self.info["meta"])
        self._fd = os.open(self.region_path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, NB * BL)
        self.region = np.frombuffer(self._map, np.uint8).reshape(NB, BL)

    @staticmethod
    def _open_writer(path):
        deadline = time.monotonic() + START_S
        while True:
            try:
                return os.fdopen(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "w")
            except OSError:  # ENXIO: the child has not opened its end yet
                assert time.monotonic() < deadline, "the p2p peer never opened its command FIFO"
                time.sleep(0.01)

    def call(self, op, timeout=30.0, **kw):
        self._cmd.write(json.dumps({"op": op, **kw}) + "\n")
        self._cmd.flush()
        return json.loads(_readline(self._out, timeout, "the p2p peer"))

    def canary(self) -> bytes:
        with open(self.canary_path, "rb") as f:
            return f.read()

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _state(self) -> str:
        with open(f"/proc/{self.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def stop(self):
        """SIGSTOP, returning once the kernel has stopped it (the signal alone is asynchronous)."""
        os.kill(self.pid, signal.SIGSTOP)
        while self._state() != "T":
            time.sleep(0.001)

    def cont(self):
        os.kill(self.pid, signal.SIGCONT)

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        while self.alive():
            time.sleep(0.001)

    def close(self):
        if self.alive():
            self.cont()
            try:
                self.call("quit", timeout=10)
            except (AssertionError, OSError):
                pass
            if self.alive():
                os.kill(self.pid, signal.SIGKILL)
        for f in (self._cmd, self._out):
            try:
                f.close()
            except OSError:
                pass
        del self.region
        try:
            self._map.close()
        except BufferError:  # a failed test's traceback still holds a view of the region; GC unmaps it
            pass
        os.close(self._fd)


def local_region(seed=1):
    """A writable (NB, BL) region of random bytes, as vLLM's CPU primary tier hands the transport."""
    buf = bytearray(np.random.default_rng(seed).integers(0, 256, NB * BL, dtype=np.uint8).tobytes())
    return buf, memoryview(buf).cast("B", (NB, BL))


def blocks_of(buf):
    return np.frombuffer(buf, np.uint8).reshape(NB, BL)


def add_peer(t, peer, peer_id="peer"):
    t.add_remote_peer(peer_id, peer.meta, peer.info["base_addr"], peer.info["num_blocks"], peer.info["block_len"])


def poll_until(t, tid, peer_id="peer", timeout=10.0):
    """('done' | 'failed', seconds) once ``tid`` surfaces in poll; fails the test after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        r = t.poll(peer_id)
        if tid in r.done or tid in r.failed:
            return ("done" if tid in r.done else "failed"), time.monotonic() - t0
        time.sleep(0.001)
    raise AssertionError(f"transfer {tid} did not surface in poll within {timeout} s")


def expect_blocks(dst, src, mapping):
    """Each dst block named in ``mapping`` (src block -> dst block) holds that src block's bytes."""
    for s, d in mapping.items():
        assert np.array_equal(dst[d], src[s]), f"destination block {d} does not hold source block {s}"


@pytest.fixture
def local():
    made = []

    def make(transport="tcp", timeout_ms=1000, token=TOKEN, seed=1):
        buf, view = local_region(seed)
        t = KvblocksTransport(view, {"model": "tiny"}, auth_token=token, transport=transport, timeout_ms=timeout_ms)
        made.append(t)
        return t, blocks_of(buf)

    yield make
    for t in made:
        t.close()


@pytest.fixture(scope="module")
def shared_tcp_peer(tmp_path_factory):
    p = PeerProc(tmp_path_factory.mktemp("shared_peer"))
    yield p
    p.close()


@pytest.fixture
def peer(tmp_path, shared_tcp_peer):
    """peer(): the module's TCP peer, its region zeroed; peer(transport=..., fresh=True): a new process."""
    made = []

    def make(transport="tcp", fresh=False):
        if transport == "tcp" and not fresh:
            assert shared_tcp_peer.alive()
            shared_tcp_peer.region[:] = 0
            return shared_tcp_peer
        d = tmp_path / f"peer{len(made)}"
        d.mkdir()
        made.append(PeerProc(d, transport=transport))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_write_and_poll_deliver_the_right_bytes_both_ways(local, peer, transport):
    a, src = local(transport)
    b = peer(transport=transport, fresh=transport != "tcp")
    add_peer(a, b)
    # vLLM's handshake runs both ways: the peer registers us too, over the same link.
    a_id = f"a{a.cluster_id}"
    meta_a = {"peer_id": a_id, "meta": a.get_agent_metadata().hex(), "base_addr": a.base_addr,
              "num_blocks": a.num_blocks, "block_len": a.block_len}
    assert b.call("add_peer", **meta_a) == {"ok": True}

    tid = a.write_blocks("peer", [0, 3, 9], [5, 7, 1])
    assert poll_until(a, tid)[0] == "done"
    expect_blocks(b.region, src, {0: 5, 3: 7, 9: 1})
    untouched = [i for i in range(NB) if i not in (5, 7, 1)]
    assert not b.region[untouched].any(), "a block outside the mapping changed"
    assert a.poll("peer") == ((), ()), "a transfer surfaced twice"

    # Negative control: a wrong block mapping is detected by the same check.
    tid = a.write_blocks("peer", [2, 4], [11, 10])
    assert poll_until(a, tid)[0] == "done"
    with pytest.raises(AssertionError, match="does not hold source block"):
        expect_blocks(b.region, src, {2: 10, 4: 11})
    expect_blocks(b.region, src, {2: 11, 4: 10})

    # The other direction: the peer writes its blocks into ours.
    before = src.copy()
    assert b.call("write_and_poll", peer_id=a_id, local=[5, 7], remote=[14, 15])["result"] == "done"
    expect_blocks(src, b.region, {5: 14, 7: 15})
    assert np.array_equal(src[:14], before[:14])
    path = a._dd.link_path(a._targets["peer"].peer.cluster_id)
    assert path == "tcp" if transport == "tcp" else path != "tcp", path


def test_cancel_returns_only_when_no_byte_can_land(local, peer):
    a, src = local("tcp", timeout_ms=3000)
    b = peer()
    add_peer(a, b)
    all_blocks = list(range(NB))

    # The peer is stopped, so the write is still in flight when cancel is called; it resumes 0.3 s later.
    b.stop()
    tid = a.write_blocks("peer", all_blocks, all_blocks)
    threading.Timer(0.3, b.cont).start()
    t0 = time.monotonic()
    assert a.cancel([tid]) == []
    took = time.monotonic() - t0
    after_return = b.region.copy()
    time.sleep(0.5)
    assert np.array_equal(b.region, after_return), "a byte of a cancelled write landed after cancel returned"
    assert took < 3.0 + 1.0, f"cancel took {took:.2f} s, past the transfer's deadline"
    assert a.poll() == ((), ()), "a cancelled transfer surfaced in poll"

    # Negative control: cancel(mode="wait") does not wait; the write lands after it returned, which
    # the same check sees; the id surfaces in poll once nothing more can land.
    b.stop()
    fresh = [(i + 1) % NB for i in all_blocks]  # another mapping, so the bytes differ from the first write
    tid = a.write_blocks("peer", all_blocks, fresh)
    assert a.cancel([tid], mode="wait") == [tid]
    after_return = b.region.copy()
    b.cont()
    state, _ = poll_until(a, tid)
    assert not np.array_equal(b.region, after_return), "control: the wait-mode write should land after cancel"
    assert state == "done"
    expect_blocks(b.region, src, dict(zip(all_blocks, fresh)))


def test_frozen_peer_fails_within_the_deadline_and_nothing_lands_after(local, peer):
    a, src = local("tcp", timeout_ms=1000)
    b = peer()
    add_peer(a, b)
    b.stop()
    try:
        tid = a.write_blocks("peer", list(range(NB)), list(range(NB)))
        state, took = poll_until(a, tid)
        assert state == "failed"
        assert took < 1.0 + 1.5, f"a write to a frozen peer surfaced after {took:.2f} s (deadline 1 s)"
    finally:
        b.cont()
    time.sleep(0.5)
    assert not b.region.any(), "bytes of the failed write landed after the peer resumed"
    # The link broke with the timeout; the next write relinks and lands.
    tid = a.write_blocks("peer", [6], [2])
    assert tid is not None and poll_until(a, tid)[0] == "done"
    expect_blocks(b.region, src, {6: 2})


def test_killed_peer_fails_fast_and_later_writes_are_refused(local, peer):
    a, _ = local("tcp", timeout_ms=5000)
    b = peer(fresh=True)
    add_peer(a, b)
    b.stop()
    tid = a.write_blocks("peer", list(range(NB)), list(range(NB)))
    b.kill()
    state, took = poll_until(a, tid)
    assert state == "failed"
    assert took < 2.0, f"a write to a killed peer surfaced after {took:.2f} s (its deadline is 5 s)"
    assert not b.region.any(), "bytes landed in a killed peer's region"
    t0 = time.monotonic()
    assert a.write_blocks("peer", [0], [0]) is None
    assert time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    a.remove_remote_peer("peer")
    a.close()
    assert time.monotonic() - t0 < 3.0


def _blob(**kw):
    d = {"kvblocks_p2p": 1, "engine_id": "e77", "host": "127.0.0.1", "port": 9, "cache_id": 1}
    d.update(kw)
    return json.dumps({k: v for k, v in d.items() if v is not ...}).encode()


HOSTILE_BLOBS = {
    "garbage": b"\x00\xff" * 40,
    "not an object": b"[1, 2, 3]",
    "oversized": _blob(host="127.0.0.1" + " " * 600),
    "extra address key": _blob(base_addr=140000000000000),
    "missing key": _blob(cache_id=...),
    "engine id not a string": _blob(engine_id=77),
    "empty engine id": _blob(engine_id=""),
    "engine id too long": _blob(engine_id="e" * 300),
    "float port": _blob(port=9.0),
    "negative cache id": _blob(cache_id=-1),
    "huge port": _blob(port=1 << 70),
    "host name": _blob(host="localhost"),
    "ipv4 with junk": _blob(host="127.0.0.1; rm"),
    "other version": _blob(kvblocks_p2p=2),
}


def test_hostile_metadata_is_refused_and_touches_nothing(local, peer):
    a, src = local("tcp")
    b = peer()
    ours = src.copy()
    info = b.info
    for name, blob in HOSTILE_BLOBS.items():
        with pytest.raises(ValueError):
            a.add_remote_peer(name, blob, info["base_addr"], NB, BL)
        assert a.write_blocks(name, [0], [0]) is None, name
    me = json.loads(a.get_agent_metadata())
    with pytest.raises(ValueError, match="itself"):
        a.add_remote_peer("me", json.dumps(me).encode(), a.base_addr, NB, BL)
    for lie in ({"block_len": BL * 2}, {"num_blocks": 0}, {"num_blocks": True}, {"num_blocks": 1 << 50}):
        kw = {"base_addr": info["base_addr"], "num_blocks": NB, "block_len": BL, **lie}
        with pytest.raises(ValueError):
            a.add_remote_peer("liar", b.meta, **kw)

    # Lies vLLM's handshake passes through: base_addr names the peer's unregistered canary and num_blocks
    # is 4x its real region. Writes beyond its real blocks fail; nothing outside the registered regions moves.
    a.add_remote_peer("liar", b.meta, info["canary_addr"], NB * 4, BL)
    for remote in ([NB], [NB * 4 - 1], [NB + 1, 0]):
        tid = a.write_blocks("liar", [0] * len(remote), remote)
        assert tid is None or poll_until(a, tid, "liar")[0] == "failed", remote
    assert b.canary() == b"\xaa" * BL, "the peer's unregistered memory changed"
    assert not b.region.any(), "a refused write changed the peer's region"
    assert b.alive(), "the peer died"
    # A cache id the peer does not have: the write fails there, and nothing changes.
    m = json.loads(b.meta)
    a.remove_remote_peer("liar")
    a.add_remote_peer("no-cache", json.dumps({**m, "cache_id": 999}).encode(), 0, NB, BL)
    tid = a.write_blocks("no-cache", [1], [1])
    assert tid is None or poll_until(a, tid, "no-cache")[0] == "failed"
    a.remove_remote_peer("no-cache")

    # The honest peer, then a second peer id claiming its endpoint (it would get the first one's writes).
    add_peer(a, b)
    with pytest.raises(ValueError, match="already held"):
        add_peer(a, b, "impostor")
    assert a.write_blocks("impostor", [0], [0]) is None
    tid = a.write_blocks("peer", [3], [4])
    assert poll_until(a, tid)[0] == "done"
    expect_blocks(b.region, src, {3: 4})
    assert np.array_equal(src, ours), "a write changed our own region"


def test_a_peer_with_another_token_is_refused(local, peer):
    a, _ = local("tcp", token="another-token")
    b = peer()
    with pytest.raises(ValueError, match="auth_refused"):
        add_peer(a, b)
    assert a.write_blocks("peer", [0], [0]) is None
    assert not b.region.any()


def test_a_transport_without_a_token_refuses_to_start(monkeypatch):
    monkeypatch.delenv("KVBLOCKS_AUTH_TOKEN", raising=False)
    _, view = local_region()
    with pytest.raises(ValueError, match="auth_token"):
        KvblocksTransport(view)


def _offloading_config(engine_id, tier, cpu_bytes=8 << 20):
    """A real vLLM OffloadingConfig for TieringOffloadingSpec with ``tier`` as its one secondary tier."""
    from vllm.v1.kv_offload import config as c

    return c.OffloadingConfig(
        groups=(c.OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=4096, enable_kv_cache_events=False,
        extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu_bytes, "secondary_tiers": [tier]},
        engine_id=engine_id, model=c.OffloadingModelConfig(name="tiny", dtype="float16"),
        cache=c.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=c.OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=0,
                                            is_parallelism_agnostic=True))


def test_vllm_builds_the_tier_from_its_module_path():
    """vLLM's own spec and factory (scheduler side, which runs on CPU too) build the tier from the config."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.p2p import manager as p2p_manager

    from ports import free_port

    tier = {"type": "KvblocksP2PTierManager", "module_path": "kvblocks.vllm.p2p_tier", "auth_token": TOKEN,
            "host": "127.0.0.1", "port": free_port()}
    mgr = OffloadingSpecFactory.create_spec(_offloading_config(f"tier-{os.getpid()}", tier)).get_manager()
    try:
        (t,) = mgr.secondary_tiers
        assert isinstance(t, p2p_manager.P2PSecondaryTierManager)
        assert type(t).__name__ == "KvblocksP2PTierManager"
        assert isinstance(t._data, KvblocksTransport), type(t._data)
        assert p2p_manager.NixlTransport.__name__ == "NixlTransport", "the swap outlived the constructor"
        view = mgr.primary_tier.get_kv_memoryview()  # the CPU primary tier the transport must register
        assert (t._data.num_blocks, t._data.block_len) == (view.shape[0], view.shape[1]) == (2048, 4096)
        assert t._data.base_addr == ctypes.addressof(ctypes.c_char.from_buffer(view))
        assert t._data._cache.tensor_addrs == [t._data.base_addr], "the kvblocks cache is not the primary region"
        del view
        meta = json.loads(t._data.get_agent_metadata())
        assert set(meta) == {"kvblocks_p2p", "engine_id", "host", "port", "cache_id"} and meta["host"] == "127.0.0.1"
    finally:
        mgr.shutdown()
    assert t._data._dd is None, "shutdown did not close the transport"


def _platform_refusal():
    """vLLM's own words when this platform cannot run an offloading worker; None where it can."""
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    if current_platform.is_cuda_alike() or current_platform.is_xpu():
        return None
    spec = TieringOffloadingSpec.__new__(TieringOffloadingSpec)  # only get_worker's platform check runs
    spec._worker = None
    try:
        spec.get_worker(None)
    except Exception as e:  # noqa: BLE001 - vLLM raises a bare Exception here
        return str(e)
    return None


def _tier_transfer_config(port, token):
    tier = {"type": "KvblocksP2PTierManager", "module_path": "kvblocks.vllm.p2p_tier", "auth_token": token,
            "host": "127.0.0.1", "port": port}
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 256 << 20,
                                          "secondary_tiers": [tier]}}


def test_engine_level_prefill_to_decode_through_the_tier(tmp_path):
    """Two vLLM engines, the decode loading the prefill's KV through the P2P tier on kvblocks: the same greedy
    tokens as one engine alone. Needs a GPU platform (vLLM refuses CPU offloading workers); not run here."""
    reason = _platform_refusal()
    if reason is not None:
        pytest.skip(f"vLLM's KV offloading needs a GPU platform; on this one vLLM says: {reason}")
    from harness import Engine, free_port, make_model

    model = make_model(str(tmp_path / "model"))
    prompt = [int(x) for x in np.random.default_rng(3).integers(10, 400, 200)]
    ref = Engine("p2p-ref", model, None, cpu=0, log_dir=str(tmp_path)).wait_ready()
    try:
        want = ref.generate([prompt], 16)["tokens"][0]
    finally:
        ref.close()
    p_port, d_port = free_port(), free_port()
    engines = [Engine(n, model, _tier_transfer_config(port, TOKEN), cpu=i, log_dir=str(tmp_path))
               for i, (n, port) in enumerate((("p2p-prefill", p_port), ("p2p-decode", d_port)))]
    try:
        pre, dec = (e.wait_ready() for e in engines)
        pre.generate([prompt], 1, [{"remote_decoder": {"kv_request_id": "r1"}}])
        got = dec.generate([prompt], 16, [{"remote_prefiller": {"kv_request_id": "r1", "remote_host": "127.0.0.1",
                                                                 "remote_port": p_port}}])["tokens"][0]
        assert got == want
    finally:
        for e in engines:
            e.close()
