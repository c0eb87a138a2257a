# SPDX-License-Identifier: Apache-2.0
# distutils: language = c++
# The Cython API of kvblocks: `from kvblocks._lib cimport ...` in downstream extensions.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp.memory cimport unique_ptr

from kvblocks.includes.libkvblocks cimport CLayerPush, CLlmDataDist, CTransferHandle, Status


cdef int check_status(Status st, const char* what) except -1 nogil


cdef class LlmDataDist:
    cdef unique_ptr[CLlmDataDist] _impl
    cdef readonly uint64_t cluster_id
    cdef object _role
    cdef dict _keepalive  # cache id -> the buffers of register_arrays, held while registered
    cdef CLlmDataDist* native(self) except NULL


# Transfers callable from any nogil code: no Python objects, status returned.
# Layer ranges are inclusive; (-1, -1) selects every layer.
cdef Status pull_blocks_nogil(CLlmDataDist* dd, uint64_t src_cluster_id, int64_t src_cache_id,
                              int64_t dst_cache_id, const uint64_t* src_blocks, const uint64_t* dst_blocks,
                              size_t n, int32_t src_first, int32_t src_last, int32_t dst_first,
                              int32_t dst_last, uint8_t tensor_num_per_layer) noexcept nogil

cdef Status push_blocks_nogil(CLlmDataDist* dd, int64_t src_cache_id, uint32_t src_num_tensors,
                              uint64_t dst_cluster_id, int64_t dst_cache_id, const uint64_t* src_blocks,
                              const uint64_t* dst_blocks, size_t n, int32_t src_first, int32_t src_last,
                              int32_t dst_first, int32_t dst_last, uint8_t tensor_num_per_layer) noexcept nogil


# Asynchronous transfers for nogil code (kvblocks runtime only; LLM_FEATURE_NOT_ENABLED against
# CANN). The submit functions run every check of the synchronous call and return its status; on
# LLM_SUCCESS `out` is the transfer in flight. Wait returns the transfer's status, or
# LLM_WAIT_PROC_TIMEOUT when `timeout_ms` (< 0: no limit) passed first (the transfer is still in
# flight). Waiting never needs the GIL; any thread may wait.
cdef Status pull_blocks_async_nogil(CLlmDataDist* dd, uint64_t src_cluster_id, int64_t src_cache_id,
                                    int64_t dst_cache_id, const uint64_t* src_blocks, const uint64_t* dst_blocks,
                                    size_t n, int32_t src_first, int32_t src_last, int32_t dst_first,
                                    int32_t dst_last, uint8_t tensor_num_per_layer,
                                    CTransferHandle* out) noexcept nogil

cdef Status push_blocks_async_nogil(CLlmDataDist* dd, int64_t src_cache_id, uint32_t src_num_tensors,
                                    uint64_t dst_cluster_id, int64_t dst_cache_id, const uint64_t* src_blocks,
                                    const uint64_t* dst_blocks, size_t n, int32_t src_first, int32_t src_last,
                                    int32_t dst_first, int32_t dst_last, uint8_t tensor_num_per_layer,
                                    CTransferHandle* out) noexcept nogil

cdef Status wait_transfer_nogil(const CTransferHandle* h, int64_t timeout_ms) noexcept nogil


# Layer-wise pushes (kvblocks runtime only). open_layer_push_nogil runs every check of the push and
# returns its status; on LLM_SUCCESS `out` is open. layer_ready_nogil queues one layer (one lock, no
# wait); finish_layer_push_nogil waits for every layer (< 0: until the push's deadline) and returns
# its status, or LLM_WAIT_PROC_TIMEOUT when `timeout_ms` passed first.
cdef class LayerPush:
    cdef CLayerPush _p
    cdef object _dd  # the engine stays alive while the push is open


cdef Status open_layer_push_nogil(CLlmDataDist* dd, int64_t src_cache_id, uint32_t src_num_tensors,
                                  uint64_t dst_cluster_id, int64_t dst_cache_id, const uint64_t* src_blocks,
                                  const uint64_t* dst_blocks, size_t n, uint8_t tensor_num_per_layer,
                                  CLayerPush* out) noexcept nogil

cdef Status layer_ready_nogil(CLayerPush* push, uint32_t layer) noexcept nogil

cdef Status finish_layer_push_nogil(CLayerPush* push, int64_t timeout_ms) noexcept nogil
