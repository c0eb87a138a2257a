# SPDX-License-Identifier: Apache-2.0
"""LlmDataDist.register_arrays: caches from numpy arrays, bytearray/mmap memoryviews and torch CPU
tensors; the descriptor is derived, the arrays are kept alive, bad buffers raise clear errors."""
import gc
import mmap
import weakref

import pytest

import kvblocks as kb

np = pytest.importorskip("numpy")

# `pair` (tests/conftest.py): a Prompt (cluster 1, listening) and a Decoder (cluster 2) in this process.


def test_numpy_arrays_derive_desc_and_move(pair):
    src = [np.arange(64, dtype=np.float16).reshape(4, 16) + t for t in range(2)]
    dst = [np.zeros((4, 16), np.float16) for _ in range(2)]
    sc = pair.p.register_arrays(src)
    dc = pair.d.register_arrays(dst)
    assert sc.cache_desc.num_tensors == 2 and sc.cache_desc.shape == (4, 16)
    assert sc.cache_desc.data_type == kb.DataType.DT_FLOAT16
    assert sc.tensor_addrs == [a.ctypes.data for a in src]
    pair.link()
    pair.d.pull_kv_blocks(kb.CacheIndex(1, sc.cache_id), dc, [3, 0], [0, 3])
    for t in range(2):
        assert dst[t][0].tobytes() == src[t][3].tobytes() and dst[t][3].tobytes() == src[t][0].tobytes()
        assert not dst[t][1:3].any()


def test_bytearray_and_mmap_memoryviews(pair):
    raw = [bytearray(range(64)) for _ in range(2)]
    views = [memoryview(b).cast("B", (4, 16)) for b in raw]
    sc = pair.p.register_arrays(views)
    assert sc.cache_desc.data_type == kb.DataType.DT_UINT8 and sc.cache_desc.shape == (4, 16)
    maps = [mmap.mmap(-1, 256) for _ in range(2)]
    mviews = [memoryview(m).cast("B").cast("i", (4, 16)) for m in maps]
    dc = pair.d.register_arrays(mviews)
    assert dc.cache_desc.data_type == kb.DataType.DT_INT32
    # same bytes per block (16 B vs 64 B) differ, so move between two uint8 caches instead
    dst = [bytearray(64) for _ in range(2)]
    dc2 = pair.d.register_arrays([memoryview(b).cast("B", (4, 16)) for b in dst])
    pair.link()
    pair.d.pull_kv_blocks(kb.CacheIndex(1, sc.cache_id), dc2, [1], [2])
    for t in range(2):
        assert dst[t][32:48] == raw[t][16:32] and dst[t][:32] == bytes(32)
    del mviews, dc
    gc.collect()


def test_arrays_are_kept_alive_while_registered(pair):
    arrays = [np.zeros((4, 16), np.int32) for _ in range(2)]
    refs = [weakref.ref(a) for a in arrays]
    cache = pair.p.register_arrays(arrays)
    del arrays
    gc.collect()
    assert all(r() is not None for r in refs)
    assert cache.numpy(1).shape == (4, 16)
    pair.p.unregister_kv_cache(cache)
    del cache
    gc.collect()
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("bad, match", [
    (lambda: [np.zeros((4, 16), np.int32)[:, ::2]], "contiguous"),
    (lambda: [np.zeros((4, 16), np.int32).T], "contiguous"),
    (lambda: [memoryview(bytes(64))], "read-only"),
    (lambda: [np.zeros((4, 16), np.int32), np.zeros((4, 8), np.int32)], "shape"),
    (lambda: [np.zeros((4, 16), np.int32), np.zeros((4, 16), np.int64)], "type"),
    (lambda: [object()], "buffer"),
    (lambda: [], "non-empty"),
])
def test_bad_buffers_raise_clear_errors(pair, bad, match):
    with pytest.raises(TypeError, match=match):
        pair.p.register_arrays(bad())


def test_read_only_numpy_array(pair):
    a = np.zeros((4, 16), np.int32)
    a.setflags(write=False)
    with pytest.raises(TypeError, match="read-only"):
        pair.p.register_arrays([a])


def test_unsupported_dtype(pair):
    with pytest.raises(TypeError):
        pair.p.register_arrays([np.zeros((4, 4), dtype=np.longdouble)])


def test_torch_cpu_tensors(pair):
    torch = pytest.importorskip("torch")
    src = [torch.arange(64, dtype=torch.bfloat16).reshape(4, 16) + t for t in range(2)]
    dst = [torch.zeros(4, 16, dtype=torch.bfloat16) for _ in range(2)]
    sc = pair.p.register_arrays(src)
    dc = pair.d.register_arrays(dst)
    assert sc.cache_desc.data_type == kb.DataType.DT_BF16
    pair.link()
    pair.d.pull_kv_blocks(kb.CacheIndex(1, sc.cache_id), dc, [2], [1])
    for t in range(2):
        assert torch.equal(dst[t][1], src[t][2]) and not dst[t][0].any()
    with pytest.raises(TypeError, match="contiguous"):
        pair.p.register_arrays([torch.zeros(4, 16).t()])


def test_array_without_a_plain_buffer_is_a_type_error():
    import numpy as np

    dd = kb.LlmDataDist(9, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        with pytest.raises(TypeError):
            dd.register_arrays([np.zeros(4, dtype="datetime64[s]")])
    finally:
        dd.finalize()


def test_arrays_stay_alive_while_registered_even_without_the_cache_object():
    import numpy as np

    class Tracked(np.ndarray):
        pass

    dd = kb.LlmDataDist(9, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        arr = np.zeros((4, 64), np.uint8).view(Tracked)
        ref = weakref.ref(arr)
        cache_id = dd.register_arrays([arr]).cache_id  # the Cache object is dropped at once
        del arr
        gc.collect()
        assert ref() is not None, "registered memory must not be freed"
        dd.unregister_kv_cache(cache_id)
        gc.collect()
        assert ref() is None, "unregistering releases the arrays"
    finally:
        dd.finalize()


def test_registered_bytearray_cannot_be_resized():
    buf = bytearray(256)
    dd = kb.LlmDataDist(9, kb.LlmRole.MIX)
    dd.initialize({kb.OPTION_DEVICE_ID: "0"})
    try:
        cache = dd.register_arrays([memoryview(buf)])
        with pytest.raises(BufferError):
            buf.extend(b"x" * 4096)  # would move the memory the runtime writes into
        dd.unregister_kv_cache(cache)
    finally:
        dd.finalize()
