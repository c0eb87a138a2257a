# SPDX-License-Identifier: Apache-2.0
"""Memory kinds (README "Architecture", backends): every cache is host memory until a backend serves
another kind. Device memory offered to register_arrays, through the CUDA array interface or DLPack, is
refused by name before anything is registered; host memory exporting the same protocols still works."""
import numpy as np
import pytest

from conftest import mix_engine


class CudaArray:
    """What a CuPy array or a CUDA torch tensor shows of itself: the CUDA array interface (v3) over a
    device pointer this process's CPU cannot address."""

    def __init__(self):
        self.__cuda_array_interface__ = {"shape": (4, 1024), "typestr": "<f2", "data": (0x7F0000000000, False),
                                         "strides": None, "version": 3}


class DLPackDevice:
    """A DLPack producer on another device (DLPack device type `kind`, device 0)."""

    def __init__(self, kind):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("the registry must refuse before asking for the capsule")


@pytest.fixture
def engine():
    e = mix_engine(1)
    yield e
    e.finalize()


@pytest.mark.parametrize("make,what", [(CudaArray, "CUDA"), (lambda: DLPackDevice(2), "CUDA"),
                                       (lambda: DLPackDevice(10), "ROCm")])
def test_device_memory_is_refused_by_name(engine, make, what):
    host = np.zeros((4, 1024), dtype=np.float16)
    with pytest.raises(TypeError, match=f"no backend serves {what} memory here"):
        engine.register_arrays([host, make()])
    # Nothing was registered: the next cache gets the first id (ids start at 1 and are never reused).
    assert engine.register_arrays([host]).cache_id == 1


def test_host_memory_with_dlpack_still_registers(engine):
    a = np.arange(4096, dtype=np.float16).reshape(4, 1024)
    assert a.__dlpack_device__()[0] == 1  # numpy: a DLPack producer on the CPU
    cache = engine.register_arrays([a])
    assert np.shares_memory(cache.numpy(0), a)  # registered in place, not copied
