# SPDX-License-Identifier: Apache-2.0
# distutils: language = c++
# Declarations of include/llm_datadist/llm_datadist.h and include/kvblocks/*.h. No logic here.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libcpp cimport bool as c_bool
from libcpp.map cimport map as c_map
from libcpp.memory cimport shared_ptr
from libcpp.pair cimport pair as c_pair
from libcpp.string cimport string as c_string
from libcpp.vector cimport vector


cdef extern from "llm_datadist/llm_datadist.h" namespace "ge" nogil:
    cdef cppclass CAscendString "ge::AscendString":
        CAscendString()
        CAscendString(const char*)
        CAscendString(const char*, size_t)
        const char* GetString()
        size_t GetLength()

    ctypedef int CDataType "ge::DataType"


cdef extern from "llm_datadist/llm_datadist.h" namespace "llm_datadist" nogil:
    ctypedef uint32_t Status

    # Only the statuses the core compares against (the compiler checks each name); Python's table,
    # kvblocks.Status, is generated from the header (tools/gen_tables.py). Option keys: likewise.
    const Status LLM_SUCCESS
    const Status LLM_WAIT_PROC_TIMEOUT
    const Status LLM_PARAM_INVALID

    cdef enum class CLlmRole "llm_datadist::LlmRole"(int32_t):
        kPrompt
        kDecoder
        kMix
        kEnd

    cdef enum class CCachePlacement "llm_datadist::CachePlacement"(uint32_t):
        kHost
        kDevice

    cdef cppclass CIpInfo "llm_datadist::IpInfo":
        CAscendString ip
        uint16_t port

    cdef cppclass CClusterInfo "llm_datadist::ClusterInfo":
        uint64_t remote_cluster_id
        int32_t remote_role_type
        vector[CIpInfo] local_ip_infos
        vector[CIpInfo] remote_ip_infos

    cdef cppclass CCacheIndex "llm_datadist::CacheIndex":
        uint64_t cluster_id
        int64_t cache_id
        uint32_t batch_index

    cdef cppclass CCacheDesc "llm_datadist::CacheDesc":
        CCachePlacement placement
        uint32_t num_tensors
        CDataType data_type
        vector[int64_t] shape

    cdef cppclass CCache "llm_datadist::Cache":
        int64_t cache_id
        vector[uintptr_t] tensor_addrs
        CCacheDesc cache_desc

    cdef cppclass CKvCacheExtParam "llm_datadist::KvCacheExtParam":
        c_pair[int32_t, int32_t] src_layer_range
        c_pair[int32_t, int32_t] dst_layer_range
        uint8_t tensor_num_per_layer

    cdef cppclass CRegisterCfg "llm_datadist::RegisterCfg":
        pass

    cdef cppclass CLlmDataDist "llm_datadist::LlmDataDist":
        CLlmDataDist(uint64_t cluster_id, CLlmRole role) except +
        Status Initialize(const c_map[CAscendString, CAscendString]& options)
        void Finalize()
        Status SetRole(CLlmRole role, const c_map[CAscendString, CAscendString]& options)
        Status LinkLlmClusters(const vector[CClusterInfo]& clusters, vector[Status]& rets, int32_t timeout)
        Status UnlinkLlmClusters(const vector[CClusterInfo]& clusters, vector[Status]& rets, int32_t timeout,
                                 c_bool force_flag)
        Status AllocateCache(const CCacheDesc& desc, CCache& cache)
        Status DeallocateCache(int64_t cache_id)
        Status PullKvCache(const CCacheIndex& src, const CCache& dst, uint32_t batch_index, int64_t size,
                           const CKvCacheExtParam& ext)
        Status PullKvBlocks(const CCacheIndex& src, const CCache& dst, const vector[uint64_t]& src_blocks,
                            const vector[uint64_t]& dst_blocks, const CKvCacheExtParam& ext)
        Status CopyKvCache(const CCache& src, const CCache& dst, uint32_t src_batch, uint32_t dst_batch,
                           uint64_t offset, int64_t size)
        Status CopyKvBlocks(const CCache& src, const CCache& dst, const vector[uint64_t]& src_blocks,
                            const vector[vector[uint64_t]]& dst_blocks_list)
        Status PushKvCache(const CCache& src, const CCacheIndex& dst, uint32_t src_batch, int64_t size,
                           const CKvCacheExtParam& ext)
        Status PushKvBlocks(const CCache& src, const CCacheIndex& dst, const vector[uint64_t]& src_blocks,
                            const vector[uint64_t]& dst_blocks, const CKvCacheExtParam& ext)
        Status RegisterKvCache(const CCacheDesc& desc, const vector[uint64_t]& addrs, const CRegisterCfg& cfg,
                               int64_t& cache_id)
        Status UnregisterKvCache(int64_t cache_id)


cdef extern from "kvblocks/rules.h" namespace "kvblocks" nogil:
    cdef cppclass CTensorSpan "kvblocks::TensorSpan":
        uint32_t src_begin
        uint32_t dst_begin
        uint32_t count

    cdef enum class RuleError "kvblocks::RuleError"(int):
        kOk
        kParamInvalid

    int64_t DataTypeBits(int64_t data_type) noexcept
    int64_t TensorBytes(int64_t data_type, const int64_t* shape, size_t ndim) noexcept
    size_t FirstOutOfRange(const uint64_t* values, size_t n, uint64_t limit) noexcept
    c_bool LayerRangeValid(int32_t first, int32_t second) noexcept
    RuleError PullTensorSpan(int32_t src_first, int32_t src_second, int32_t dst_first, int32_t dst_second,
                             uint32_t tnpl, uint32_t local_tensors, c_bool* explicit_range,
                             CTensorSpan* span) noexcept
    RuleError PushRangesValid(int32_t src_first, int32_t src_second, int32_t dst_first, int32_t dst_second,
                              uint32_t desc_tensors) noexcept
    RuleError PushTensorSpan(int32_t src_first, int32_t src_second, int32_t dst_first, uint32_t tnpl,
                             uint32_t local_tensors, uint32_t remote_tensors, CTensorSpan* span) noexcept


cdef extern from "ext_shim.h" namespace "kvblocks" nogil:
    const char* LastErrorMessage "kvblocks::LastErrorMessage"() noexcept
    ctypedef void (*LogCallback "kvblocks::LogCallback")(void* user, int level, const char* message) noexcept nogil
    void SetLogCallback "kvblocks::SetLogCallback"(LogCallback cb, void* user) noexcept
    ctypedef enum CLinkFailureReason "kvblocks::LinkFailureReason":
        pass
    cdef cppclass CLinkFailure "kvblocks::LinkFailure":
        CLinkFailureReason reason
        Status status
        c_string message
    c_string ProcessMetricsJson "kvblocks::ProcessMetricsJson"() noexcept
    Status PullBlocksRaw "kvblocks::PullBlocksRaw"(CLlmDataDist& dd, const CCacheIndex& src, const CCache& dst,
                                                   const uint64_t* sb, const uint64_t* db, size_t n,
                                                   const CKvCacheExtParam& ext) noexcept
    Status PushBlocksRaw "kvblocks::PushBlocksRaw"(CLlmDataDist& dd, const CCache& src, const CCacheIndex& dst,
                                                   const uint64_t* sb, const uint64_t* db, size_t n,
                                                   const CKvCacheExtParam& ext) noexcept

    cdef cppclass CTransferHandle "kvblocks::TransferHandle":
        CTransferHandle()
        c_bool Valid() noexcept
        c_bool Done() noexcept
        Status Wait(int64_t timeout_ms) noexcept
        Status GetStatus "Status"() noexcept
        const char* Message() noexcept

    cdef cppclass CBlocksRequest "kvblocks::BlocksRequest":
        c_bool pull
        CCacheIndex remote
        CCache local
        vector[uint64_t] src_blocks
        vector[uint64_t] dst_blocks
        CKvCacheExtParam ext

    Status PullBlocksAsyncRaw "kvblocks::PullBlocksAsyncRaw"(CLlmDataDist& dd, const CCacheIndex& src,
                                                             const CCache& dst, const uint64_t* sb,
                                                             const uint64_t* db, size_t n,
                                                             const CKvCacheExtParam& ext,
                                                             CTransferHandle& out) noexcept
    Status PushBlocksAsyncRaw "kvblocks::PushBlocksAsyncRaw"(CLlmDataDist& dd, const CCache& src,
                                                             const CCacheIndex& dst, const uint64_t* sb,
                                                             const uint64_t* db, size_t n,
                                                             const CKvCacheExtParam& ext,
                                                             CTransferHandle& out) noexcept

    cdef cppclass CLayerPush "kvblocks::LayerPush":
        CLayerPush()
        c_bool Valid() noexcept
        uint32_t NumLayers() noexcept
        Status LayerReady(uint32_t layer) noexcept
        Status Finish(int64_t timeout_ms) noexcept
        Status Abort() noexcept
        Status Drain() noexcept
        c_bool Done() noexcept
        Status GetStatus "Status"() noexcept
        uint32_t LayersSent() noexcept
        const char* Message() noexcept

    Status OpenLayerPushRaw "kvblocks::OpenLayerPushRaw"(CLlmDataDist& dd, const CCache& src, const CCacheIndex& dst,
                                                         const uint64_t* sb, const uint64_t* db, size_t n,
                                                         uint8_t tnpl, CLayerPush& out) noexcept

    cdef cppclass CLayerSegment "kvblocks::LayerSegment":
        uint64_t src_off
        uint64_t dst_off
        uint64_t len

    cdef cppclass CLayerPiece "kvblocks::LayerPiece":
        uint32_t layer
        uint32_t src_tensor
        int64_t dst_cache_id
        uint32_t dst_tensor
        uint64_t dst_addr
        vector[CLayerSegment] segs

    cdef enum class CCacheKind "kvblocks::CacheKind"(uint8_t):
        kMix
        kBlocks
        kCache

    cdef cppclass CNotifyMessage "kvblocks::NotifyMessage":
        uint64_t from_cluster_id
        c_string name
        c_string message
    cdef cppclass CRemoteCacheInfo "kvblocks::RemoteCacheInfo":
        int64_t cache_id
        int64_t key
        c_bool allocated
        vector[int64_t] batch_keys
        uint32_t num_tensors
        uint64_t tensor_bytes
        uint64_t num_blocks
        uint64_t batch_size
        uint64_t stride
        vector[uint64_t] addrs

    cdef cppclass ImplAccess "kvblocks::ImplAccess":
        @staticmethod
        Status AddCache(CLlmDataDist& dd, const CCacheDesc& desc, const vector[uint64_t]& addrs,
                        CCacheKind kind, int64_t key, CCache& out)
        @staticmethod
        Status FindRemoteCache(CLlmDataDist& dd, uint64_t cluster_id, int64_t key, int64_t& cache_id)
        @staticmethod
        Status DescribeRemoteCache(CLlmDataDist& dd, uint64_t cluster_id, int64_t cache_id, CRemoteCacheInfo& out)
        @staticmethod
        c_string LinkPath(CLlmDataDist& dd, uint64_t cluster_id) except +
        @staticmethod
        shared_ptr[void] PinCacheMemory(CLlmDataDist& dd, int64_t cache_id)
        @staticmethod
        int LinkChannels(CLlmDataDist& dd, uint64_t cluster_id)
        @staticmethod
        c_bool LastLinkFailure(CLlmDataDist& dd, uint64_t cluster_id, CLinkFailure& out) noexcept
        @staticmethod
        const char* LinkFailureReasonName(CLinkFailureReason reason) noexcept
        @staticmethod
        c_string ListenAddress(CLlmDataDist& dd) except +
        @staticmethod
        c_bool HasLinks(CLlmDataDist& dd)
        @staticmethod
        c_string MetricsJson(CLlmDataDist& dd) noexcept
        @staticmethod
        Status SetBatchKeys(CLlmDataDist& dd, int64_t cache_id, const vector[int64_t]& keys) noexcept
        @staticmethod
        Status FindRemoteKey(CLlmDataDist& dd, uint64_t cluster_id, int64_t key, int64_t& cache_id,
                             uint32_t& batch_index) noexcept
        @staticmethod
        Status DeallocateWhenUnbound(CLlmDataDist& dd, int64_t cache_id, c_bool& deferred) noexcept
        @staticmethod
        Status UnbindKey(CLlmDataDist& dd, int64_t cache_id, int64_t key, c_bool& was_bound) noexcept
        @staticmethod
        Status ReleaseRemoteKey(CLlmDataDist& dd, uint64_t cluster_id, int64_t cache_id, int64_t key) noexcept
        @staticmethod
        Status PullRowToBlocks(CLlmDataDist& dd, const CCacheIndex& src, const CCache& dst,
                               const vector[uint64_t]& dst_blocks, const CKvCacheExtParam& ext) noexcept
        @staticmethod
        Status PullKvBlocksAsync(CLlmDataDist& dd, const CCacheIndex& src, const CCache& dst,
                                 const vector[uint64_t]& src_blocks, const vector[uint64_t]& dst_blocks,
                                 const CKvCacheExtParam& ext, CTransferHandle& out) noexcept
        @staticmethod
        Status PushKvBlocksAsync(CLlmDataDist& dd, const CCache& src, const CCacheIndex& dst,
                                 const vector[uint64_t]& src_blocks, const vector[uint64_t]& dst_blocks,
                                 const CKvCacheExtParam& ext, CTransferHandle& out) noexcept
        @staticmethod
        Status SubmitBlocksBatch(CLlmDataDist& dd, const vector[CBlocksRequest]& requests,
                                 vector[CTransferHandle]& out, size_t& failed) noexcept
        @staticmethod
        Status SendNotify(CLlmDataDist& dd, uint64_t cluster_id, const c_string& name, const c_string& message,
                          int32_t timeout_ms) noexcept
        @staticmethod
        Status GetNotifies(CLlmDataDist& dd, vector[CNotifyMessage]& out) noexcept
        @staticmethod
        Status OpenLayerPush(CLlmDataDist& dd, const CCache& src, const CCacheIndex& dst,
                             const vector[uint64_t]& src_blocks, const vector[uint64_t]& dst_blocks,
                             uint8_t tensor_num_per_layer, CLayerPush& out) noexcept
        @staticmethod
        Status OpenLayerPushPieces(CLlmDataDist& dd, const CCache& src, uint64_t dst_cluster_id,
                                   uint32_t num_layers, const vector[CLayerPiece]& pieces,
                                   c_bool per_layer_deadline, CLayerPush& out) noexcept


cdef extern from "log_queue.h" namespace "kvblocks" nogil:
    cdef cppclass LogQueue "kvblocks::LogQueue":
        LogQueue()
        @staticmethod
        void Push(void* self, int level, const char* message) noexcept
        c_bool Wait(int64_t wait_ms) noexcept
        c_bool Pop(int* level, c_string* message) noexcept
        void ResetAfterFork() noexcept
