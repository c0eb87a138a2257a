# SPDX-License-Identifier: Apache-2.0
# distutils: language = c++
# Declarations of include/hixl/hixl.h and hixl_types.h. No logic here.
from libc.stdint cimport int32_t, uint8_t, uint32_t, uintptr_t
from libcpp cimport bool as c_bool
from libcpp.map cimport map as c_map
from libcpp.vector cimport vector

from kvblocks.includes.libkvblocks cimport CAscendString


cdef extern from "hixl/hixl.h" namespace "hixl" nogil:
    ctypedef uint32_t HStatus "hixl::Status"
    const HStatus H_PARAM_INVALID "hixl::PARAM_INVALID"
    ctypedef void* HTransferReq "hixl::TransferReq"
    ctypedef void* HMemHandle "hixl::MemHandle"

    cdef enum HMemType "hixl::MemType":
        pass
    cdef enum HTransferOp "hixl::TransferOp":
        pass
    cdef enum HFeatureType "hixl::FeatureType":
        pass
    cdef enum class HTransferStatus "hixl::TransferStatus"(int):
        pass
    cdef enum class HAsyncConnectStatus "hixl::AsyncConnectStatus"(int):
        pass

    cdef struct HMemDesc "hixl::MemDesc":
        uintptr_t addr
        size_t len

    cdef struct HTransferOpDesc "hixl::TransferOpDesc":
        uintptr_t local_addr
        uintptr_t remote_addr
        size_t len

    cdef cppclass HTransferArgs "hixl::TransferArgs":
        const void* user_data

    cdef cppclass HGetTransferStatusArgs "hixl::GetTransferStatusArgs":
        uint32_t max_query_count
        c_bool skip_waiting

    cdef cppclass HTransferResult "hixl::TransferResult":
        HTransferReq req
        const void* user_data
        HTransferStatus status

    cdef cppclass HNotifyDesc "hixl::NotifyDesc":
        CAscendString name
        CAscendString notify_msg

    cdef cppclass CHixl "hixl::Hixl":
        CHixl() except +
        HStatus Initialize(const CAscendString& local_engine, const c_map[CAscendString, CAscendString]& options)
        void Finalize()
        HStatus RegisterMem(const HMemDesc& mem, HMemType type, HMemHandle& mem_handle)
        HStatus DeregisterMem(HMemHandle mem_handle)
        HStatus Connect(const CAscendString& remote_engine, int32_t timeout_in_millis)
        HStatus Disconnect(const CAscendString& remote_engine, int32_t timeout_in_millis)
        HStatus ConnectAsync(const CAscendString& remote_engine, int32_t timeout_in_millis)
        HStatus DisconnectAsync(const CAscendString& remote_engine, int32_t timeout_in_millis)
        HStatus GetAsyncConnectStatus(const CAscendString& remote_engine, HAsyncConnectStatus& status)
        HStatus GetAsyncConnectStatus(c_map[CAscendString, HAsyncConnectStatus]& statuses)
        HStatus TransferSync(const CAscendString& remote_engine, HTransferOp operation,
                             const vector[HTransferOpDesc]& op_descs, int32_t timeout_in_millis)
        HStatus TransferAsync(const CAscendString& remote_engine, HTransferOp operation,
                              const vector[HTransferOpDesc]& op_descs, const HTransferArgs& optional_args,
                              HTransferReq& req)
        HStatus GetTransferStatus(const HTransferReq& req, HTransferStatus& status)
        HStatus GetTransferStatus(const HGetTransferStatusArgs& args, vector[HTransferResult]& results)
        HStatus SendNotify(const CAscendString& remote_engine, const HNotifyDesc& notify, int32_t timeout_in_millis)
        HStatus GetNotifies(vector[HNotifyDesc]& notifies)
        @staticmethod
        HStatus GetCapability(HFeatureType feature_type, int32_t& value)
