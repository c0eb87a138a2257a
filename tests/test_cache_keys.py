# SPDX-License-Identifier: Apache-2.0
"""CacheKey -> batch index, key release after pull_cache, and pull_blocks from a contiguous cache
(spec hixl.md 3.4, cases L17-L22; each test names its case).

The owner P is a plain kvblocks engine binding keys exactly as the compat CacheManager does
(``_set_batch_keys``); the puller D is the compat LLMDataDist (one per process, as CANN). The
two-process forms run as compat samples (tests/test_compat_samples.py); the L20 tests drive owners
and a second puller in real second processes (tests/key_peer.py)."""
import gc
import json
import os
import struct
import subprocess
import sys
import time

import pytest

import kvblocks as kb
from kvblocks.llm_datadist import (CacheDesc, CacheKey, CacheKeyByIdAndIndex, DataType, LLMClusterInfo, LLMConfig,
                                   LLMDataDist, LLMException, LLMRole, LLMStatusCode)

np = pytest.importorskip("numpy")
from ports import free_port  # noqa: E402
from hostile import open_link, recv_frame, send_frame  # noqa: E402

P_ID, D_ID = 1, 2
SHAPE = [2, 64]  # INT32: batch rows of 256 bytes
S = LLMStatusCode
PLACEHOLDER = CacheKey(P_ID, 2**64 - 1)


class Owner:
    def __init__(self):
        self.port = free_port()
        self.dd = kb.LlmDataDist(P_ID, kb.LlmRole.PROMPT)
        self.dd.initialize({kb.OPTION_DEVICE_ID: "0", kb.OPTION_LISTEN_IP_INFO: f"127.0.0.1:{self.port}",
                            kb.OPTION_ROLE_CHECK: "0"})
        self.desc = kb.CacheDesc(4, kb.DataType.DT_INT32, SHAPE)

    def allocate(self, keys, owner_tag=0):
        c = self.dd._add_cache(self.desc, None, 2, keys[0]._key() if keys else -1, None)
        self.dd._set_batch_keys(c, [-1 if k is PLACEHOLDER else k._key() for k in keys])
        for t in range(4):
            c.numpy(t)[:] = np.arange(128, dtype=np.int32).reshape(SHAPE) + 1000 * t + 100_000 * owner_tag
        return c

    def register(self, keys):
        arrays = [np.arange(128, dtype=np.int32).reshape(SHAPE) + 7000 * t for t in range(4)]
        c = self.dd._add_cache(self.desc, [a.ctypes.data for a in arrays], 2, keys[0]._key(), arrays)
        self.dd._set_batch_keys(c, [k._key() for k in keys])
        return c, arrays


def options():
    cfg = LLMConfig()
    cfg.device_id = 0
    cfg.enable_cache_manager = True
    return cfg.generate_options()


def link(d, port):
    c = LLMClusterInfo()
    c.remote_cluster_id = P_ID
    c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    ret, _ = d.link_clusters([c])
    assert ret == S.LLM_SUCCESS


@pytest.fixture
def pair():
    owner = Owner()
    d = LLMDataDist(LLMRole.DECODER, D_ID)
    d.init(options())
    cm = d.cache_manager
    arrays = [np.zeros(SHAPE, np.int32) for _ in range(4)]
    local = cm.register_cache(CacheDesc(4, SHAPE, DataType.DT_INT32), [a.ctypes.data for a in arrays])
    yield owner, d, cm, local, arrays
    d.finalize()
    owner.dd.finalize()
    gc.collect()


def rows(cache, b):
    return [cache.numpy(t)[b].copy() for t in range(4)]


def test_L17_each_key_has_its_batch_and_is_released_after_the_pull(pair):
    owner, d, cm, local, arrays = pair
    k0, k1 = CacheKey(P_ID, 10), CacheKey(P_ID, 11)
    src = owner.allocate([k0, k1])
    link(d, owner.port)
    cm.pull_cache(k1, local, batch_index=0)
    assert all(np.array_equal(arrays[t][0], r) for t, r in enumerate(rows(src, 1)))  # negative control: batch 0
    assert not any(a[1].any() for a in arrays)
    with pytest.raises(LLMException) as e:
        cm.pull_cache(k1, local, batch_index=1)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    cm.pull_cache(k0, local, batch_index=1)  # the other key is still there, at batch 0
    assert all(np.array_equal(arrays[t][1], r) for t, r in enumerate(rows(src, 0)))


def test_L18_keys_of_a_registered_cache_are_never_released(pair):
    owner, d, cm, local, arrays = pair
    k0 = CacheKey(P_ID, 20)
    _, src = owner.register([k0])
    link(d, owner.port)
    cm.pull_cache(k0, local)
    cm.pull_cache(k0, local, batch_index=1)
    assert np.array_equal(arrays[2][1], src[2][0])


def test_L19_placeholder_and_cache_id_index(pair):
    owner, d, cm, local, arrays = pair
    k1 = CacheKey(P_ID, 31)
    src = owner.allocate([PLACEHOLDER, k1])
    link(d, owner.port)
    cm.pull_cache(k1, local, batch_index=0)
    assert np.array_equal(arrays[3][0], src.numpy(3)[1])
    cm.pull_cache(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), local, batch_index=1)
    assert np.array_equal(arrays[3][1], src.numpy(3)[0])


def test_L19_owner_side_key_checks():
    d = LLMDataDist(LLMRole.PROMPT, P_ID)
    d.init(options())
    try:
        cm = d.cache_manager
        desc = CacheDesc(4, SHAPE, DataType.DT_INT32)
        with pytest.raises(LLMException) as e:
            cm.allocate_cache(desc, [CacheKey(P_ID, 1), CacheKey(P_ID, 2), CacheKey(P_ID, 3)])
        assert e.value.status_code == S.LLM_PARAM_INVALID
        with pytest.raises(LLMException):
            cm.allocate_cache(desc, [CacheKey(P_ID, 1), CacheKey(P_ID, 1)])
        c = cm.allocate_cache(desc, [CacheKey(P_ID, 1), PLACEHOLDER])
        with pytest.raises(LLMException) as e:
            cm.allocate_cache(desc, [CacheKey(P_ID, 1)])
        assert e.value.status_code == S.LLM_PARAM_INVALID
        cm.allocate_cache(desc, [PLACEHOLDER, PLACEHOLDER])  # placeholders may repeat [KVB]
        assert cm.remove_cache_key(CacheKey(P_ID, 1)) is None
        assert cm.remove_cache_key(CacheKey(P_ID, 99)) is None  # unknown: no-op
        cm.allocate_cache(desc, [CacheKey(P_ID, 1)])  # unbound by remove_cache_key
        cm.deallocate_cache(c)
    finally:
        d.finalize()


def test_L21_layer_ranged_pulls_release_the_key_after_the_last_layer(pair):
    owner, d, cm, local, arrays = pair
    k0 = CacheKey(P_ID, 40)
    src = owner.allocate([k0])
    link(d, owner.port)
    cm.pull_cache(k0, local, src_layer_range=range(0, 1), dst_layer_range=range(0, 1))
    assert np.array_equal(arrays[1][0], src.numpy(1)[0]) and not arrays[2].any()
    cm.pull_cache(k0, local, src_layer_range=range(1, 2), dst_layer_range=range(1, 2))
    assert np.array_equal(arrays[3][0], src.numpy(3)[0])
    with pytest.raises(LLMException) as e:
        cm.pull_cache(k0, local)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST


def test_L22_a_pull_by_cache_id_and_index_counts_as_a_pull_by_its_key(pair):
    owner, d, cm, local, arrays = pair
    k0, k1 = CacheKey(P_ID, 50), CacheKey(P_ID, 51)
    src = owner.allocate([k0, k1])
    link(d, owner.port)
    cm.pull_cache(CacheKeyByIdAndIndex(P_ID, src.cache_id, 1), local)
    assert np.array_equal(arrays[0][0], src.numpy(0)[1])
    with pytest.raises(LLMException) as e:
        cm.pull_cache(k1, local)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    cm.pull_cache(k0, local)  # k0 untouched


def test_pull_blocks_from_a_contiguous_cache_cuts_the_row_into_local_blocks(pair):
    # spec hixl.md 3.5 pull_from_cache_to_blocks: a 256-byte row, local blocks of 64 bytes.
    owner, d, cm, _, _ = pair
    k0 = CacheKey(P_ID, 60)
    src = owner.allocate([PLACEHOLDER, k0])
    blocks = [np.zeros((8, 16), np.int32) for _ in range(4)]
    bc = cm.register_blocks_cache(CacheDesc(4, [8, 16], DataType.DT_INT32), [a.ctypes.data for a in blocks])
    link(d, owner.port)
    cm.pull_blocks(k0, bc, src_blocks=[], dst_blocks=[5, 2, 7])
    for t in range(4):
        row = src.numpy(t)[1].reshape(4, 16)  # batch 1: chunk j = row[j]
        assert np.array_equal(blocks[t][5], row[0]) and np.array_equal(blocks[t][2], row[1])
        assert np.array_equal(blocks[t][7], row[2])
        assert not blocks[t][[0, 1, 3, 4, 6]].any()
    with pytest.raises(LLMException) as e:  # consumed
        cm.pull_blocks(k0, bc, dst_blocks=[0])
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    with pytest.raises(LLMException) as e:  # 5 chunks of a 4-block row
        cm.pull_blocks(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), bc, dst_blocks=[0, 1, 2, 3, 4])
    assert e.value.status_code == S.LLM_PARAM_INVALID
    with pytest.raises(LLMException) as e:  # local block out of range
        cm.pull_blocks(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), bc, dst_blocks=[8])
    assert e.value.status_code == S.LLM_PARAM_INVALID
    assert not blocks[0][0].any()
    cm.pull_blocks(CacheKeyByIdAndIndex(P_ID, src.cache_id, 0), bc, dst_blocks=[0], src_layer_range=range(1, 2),
                   dst_layer_range=range(1, 2))
    assert np.array_equal(blocks[2][0], src.numpy(2)[0].reshape(4, 16)[0]) and not blocks[0][0].any()


def test_cache_per_device_tensor_addrs(pair):
    _, _, cm, local, arrays = pair
    assert local.per_device_tensor_addrs == [[a.ctypes.data for a in arrays]] == [local.tensor_addrs]


# --------------------------------------------------------------------------- L20: the owner learns of releases
class KeyPeer:
    """tests/key_peer.py in a real second process, driven by JSON lines."""

    def __init__(self, *args):
        here = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen([sys.executable, os.path.join(here, "key_peer.py"), *map(str, args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first = self.read()

    def read(self):
        line = self.proc.stdout.readline()
        assert line, f"key_peer.py exited with {self.proc.wait(10)}"
        return json.loads(line)

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self):
        try:
            self.proc.stdin.write('{"op": "exit"}\n')
            self.proc.stdin.close()
        except OSError:
            pass
        assert self.proc.wait(30) == 0


@pytest.fixture
def decoder():
    d = LLMDataDist(LLMRole.DECODER, 3)
    d.init(options())
    cm = d.cache_manager
    arrays = [np.zeros([2, 64], np.int32) for _ in range(2)]
    local = cm.register_cache(CacheDesc(2, [2, 64], DataType.DT_INT32), [a.ctypes.data for a in arrays])
    yield d, cm, local, arrays
    d.finalize()
    gc.collect()


def _gone(cm, local, cache_id, timeout=10.0):
    """True once the owner freed cache ``cache_id`` (a pull by id and index finds no cache)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            cm.pull_cache(CacheKeyByIdAndIndex(P_ID, cache_id, 1), local, batch_index=1)
        except LLMException as e:
            if e.status_code == S.LLM_KV_CACHE_NOT_EXIST:
                return True
            raise
        time.sleep(0.02)
    return False


def test_L20_deallocate_is_deferred_until_the_pull_consumes_the_last_key(decoder):
    d, cm, local, arrays = decoder
    port = free_port()
    owner = KeyPeer("owner", port, 70)
    try:
        cid = owner.first["cache_id"]
        assert owner.call(op="deallocate") == {"ok": True}  # keys bound: deferred
        link(d, port)
        cm.pull_cache(CacheKeyByIdAndIndex(P_ID, cid, 1), local, batch_index=1)  # still there (unbound row)
        assert (arrays[0][1] == 2).all()
        cm.pull_cache(CacheKey(P_ID, 70), local)
        assert (arrays[1][0] == 1).all()
        assert _gone(cm, local, cid)  # the owner freed it once the key was consumed
        with pytest.raises(LLMException) as e:
            cm.pull_cache(CacheKey(P_ID, 70), local)
        assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    finally:
        owner.close()


def test_L20_control_a_partial_pull_does_not_free_the_deferred_cache(decoder):
    d, cm, local, arrays = decoder
    port = free_port()
    owner = KeyPeer("owner", port, 71)
    try:
        cid = owner.first["cache_id"]
        assert owner.call(op="deallocate") == {"ok": True}
        link(d, port)
        cm.pull_cache(CacheKey(P_ID, 71), local, src_layer_range=range(0, 1), dst_layer_range=range(0, 1),
                      tensor_num_per_layer=1)  # tensor 0 only: the key still owes tensor 1
        assert (arrays[0][0] == 1).all() and not arrays[1].any()
        assert not _gone(cm, local, cid, timeout=0.5)
        cm.pull_cache(CacheKey(P_ID, 71), local, src_layer_range=range(1, 2), dst_layer_range=range(1, 2),
                      tensor_num_per_layer=1)
        assert (arrays[1][0] == 1).all()
        assert _gone(cm, local, cid)
    finally:
        owner.close()


def test_L20_a_second_puller_gets_not_exist_after_the_first_consumed_the_key(decoder):
    d, cm, local, arrays = decoder
    port = free_port()
    owner = KeyPeer("owner", port, 80, 81)
    other = None
    try:
        cid = owner.first["cache_id"]
        other = KeyPeer("puller", port)  # linked before the key is consumed: its table still has k0
        assert other.first == {"linked": True}
        link(d, port)
        cm.pull_cache(CacheKey(P_ID, 80), local)
        assert (arrays[0][0] == 1).all()
        assert other.call(op="released", key=80, cache_id=cid) == {"released": True}
        assert other.call(op="pull", key=80) == {"status": "LLM_KV_CACHE_NOT_EXIST"}
        assert other.call(op="pull", key=81) == {"status": "LLM_SUCCESS", "first": 2}  # control: k1 still bound
        assert owner.call(op="deallocate") == {"ok": True}  # k0 gone, k1 consumed by `other`: freed now
        assert _gone(cm, local, cid)
    finally:
        if other is not None:
            other.close()
        owner.close()


def test_L20_a_hostile_peer_can_release_only_bound_keys_of_allocated_caches_it_was_shown(pair):
    """KEY_CONSUMED (docs/protocol.md) from a hand-written peer: malformed frames, a registered
    cache, a key not bound to the named cache, an unknown cache and a cache created after the link
    change nothing; a well-formed claim releases exactly its key."""
    KEY_CONSUMED, NOTIFY, NOTIFY_ACK = 18, 16, 17
    owner, d, cm, local, arrays = pair
    ka0, ka1, kr, kc = (CacheKey(P_ID, r) for r in (90, 91, 92, 93))
    a = owner.allocate([ka0, ka1])
    r, _ = owner.register([kr])
    ctrl, _ = open_link(owner.port, cluster_id=77)
    ctrl.settimeout(10)
    c = owner.allocate([kc])  # after the link: that peer was never shown it

    def claim(payload):
        send_frame(ctrl, KEY_CONSUMED, payload)

    def processed(seq):  # the control loop handles frames in order: a NOTIFY's ack follows them
        send_frame(ctrl, NOTIFY, struct.pack("<QIII", seq, 0, 1, 1) + b"nm")
        while recv_frame(ctrl)[0] != NOTIFY_ACK:
            pass

    claim(struct.pack("<q", a.cache_id))  # short
    claim(struct.pack("<qqB", a.cache_id, ka0._key(), 0))  # trailing byte
    claim(struct.pack("<qq", a.cache_id, -1))  # negative key
    claim(struct.pack("<qq", r.cache_id, kr._key()))  # registered: never released
    claim(struct.pack("<qq", a.cache_id, kr._key()))  # bound, but to another cache
    claim(struct.pack("<qq", a.cache_id, 12345))  # not bound at all
    claim(struct.pack("<qq", 999, ka0._key()))  # no such cache
    claim(struct.pack("<qq", c.cache_id, kc._key()))  # not in the table it got
    processed(1)
    link(d, owner.port)
    for cache, keys in ((a, [ka0, ka1]), (r, [kr]), (c, [kc])):
        assert d._engine._describe_remote_cache(P_ID, cache.cache_id)["batch_keys"] == [k._key() for k in keys]
    claim(struct.pack("<qq", a.cache_id, ka0._key()))  # well-formed: released, d is told
    processed(2)
    deadline = time.monotonic() + 10
    while d._engine._describe_remote_cache(P_ID, a.cache_id)["batch_keys"][0] != -1:
        assert time.monotonic() < deadline, "the owner did not announce the release"
        time.sleep(0.01)
    with pytest.raises(LLMException) as e:
        cm.pull_cache(ka0, local)
    assert e.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
    cm.pull_cache(ka1, local)  # the other key of the batch is untouched
    assert np.array_equal(arrays[0][0], a.numpy(0)[1])
    ctrl.close()
