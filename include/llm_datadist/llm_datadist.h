// SPDX-License-Identifier: Apache-2.0
// kvblocks: a source-compatible implementation of CANN's public llm_datadist/llm_datadist.h.
// Names, numeric values, signatures and default arguments match CANN, so code written against
// CANN LLM-DataDist compiles against this header and links to kvblocks' libllm_datadist.so.
#ifndef LLM_DATADIST_LLM_DATADIST_H_
#define LLM_DATADIST_LLM_DATADIST_H_

// What CANN's header brings in through its own includes, which programs written against it use
// without including themselves.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvblocks/ge_types.h"

#if defined(__GNUC__)
#define KVBLOCKS_API __attribute__((visibility("default")))
#else
#define KVBLOCKS_API
#endif

namespace kvblocks {
struct ImplAccess;  // kvblocks' own extensions (include/kvblocks/ext.h) reach the implementation here
}  // namespace kvblocks

namespace llm_datadist {

using Status = ge::Status;
using AscendString = ge::AscendString;
using DataType = ge::DataType;

// ---- option keys accepted by Initialize / SetRole ----
constexpr const char OPTION_LISTEN_IP_INFO[] = "llm.ListenIpInfo";                // "ip:port" to listen on
constexpr const char OPTION_DEVICE_ID[] = "llm.DeviceId";                         // required, integer >= 0
constexpr const char OPTION_SYNC_CACHE_WAIT_TIME[] = "llm.SyncKvCacheWaitTime";   // transfer deadline in ms
constexpr const char OPTION_BUF_POOL_CFG[] = "llm.BufPoolCfg";                    // accepted, unused
constexpr const char OPTION_ENABLE_SET_ROLE[] = "llm.EnableSwitchRole";           // accepted, unused
constexpr const char OPTION_LOCAL_COMM_RES[] = "llm.LocalCommRes";                // accepted, unused
constexpr const char OPTION_TRANSFER_BACKEND[] = "llm.TransferBackend";           // only "hixl" accepted
constexpr const char OPTION_GLOBAL_RESOURCE_CONFIG[] = "llm.GlobalResourceConfig";  // accepted, unused

// ---- status codes: 0x5010B000 + n, LLM_FAILED is all ones ----
constexpr Status LLM_SUCCESS = 0x0U;
constexpr Status LLM_FAILED = 0xFFFFFFFFU;
constexpr Status LLM_WAIT_PROC_TIMEOUT = 0x5010B001U;
constexpr Status LLM_KV_CACHE_NOT_EXIST = 0x5010B002U;
constexpr Status LLM_REPEAT_REQUEST = 0x5010B003U;
constexpr Status LLM_REQUEST_ALREADY_COMPLETED = 0x5010B004U;
constexpr Status LLM_PARAM_INVALID = 0x5010B005U;
constexpr Status LLM_ENGINE_FINALIZED = 0x5010B006U;
constexpr Status LLM_NOT_YET_LINK = 0x5010B007U;
constexpr Status LLM_ALREADY_LINK = 0x5010B008U;
constexpr Status LLM_LINK_FAILED = 0x5010B009U;
constexpr Status LLM_UNLINK_FAILED = 0x5010B00AU;
constexpr Status LLM_NOTIFY_PROMPT_UNLINK_FAILED = 0x5010B00BU;
constexpr Status LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010B00CU;
constexpr Status LLM_PROCESSING_LINK = 0x5010B00DU;
constexpr Status LLM_DEVICE_OUT_OF_MEMORY = 0x5010B00EU;
constexpr Status LLM_PREFIX_ALREADY_EXIST = 0x5010B00FU;
constexpr Status LLM_PREFIX_NOT_EXIST = 0x5010B010U;
constexpr Status LLM_SEQ_LEN_OVER_LIMIT = 0x5010B011U;
constexpr Status LLM_NO_FREE_BLOCK = 0x5010B012U;
constexpr Status LLM_BLOCKS_OUT_OF_MEMORY = 0x5010B013U;
constexpr Status LLM_CACHE_INCOMPATIBLE = 0x5010B014U;
constexpr Status LLM_CACHE_KEY_ALREADY_EXIST = 0x5010B015U;
constexpr Status LLM_COPY_CACHE_FAILED = 0x5010B016U;
constexpr Status LLM_CACHE_ID_ALREADY_EXIST = 0x5010B017U;
constexpr Status LLM_EXIST_LINK = 0x5010B018U;
constexpr Status LLM_FEATURE_NOT_ENABLED = 0x5010B019U;
constexpr Status LLM_TIMEOUT = 0x5010B01AU;
constexpr Status LLM_LINK_BUSY = 0x5010B01BU;
constexpr Status LLM_OUT_OF_MEMORY = 0x5010B01CU;

// ---- data types (ge numbering) ----
using ge::DT_BF16;
using ge::DT_BOOL;
using ge::DT_COMPLEX128;
using ge::DT_COMPLEX32;
using ge::DT_COMPLEX64;
using ge::DT_DOUBLE;
using ge::DT_DUAL;
using ge::DT_DUAL_SUB_INT8;
using ge::DT_DUAL_SUB_UINT8;
using ge::DT_FLOAT;
using ge::DT_FLOAT16;
using ge::DT_FLOAT4_E1M2;
using ge::DT_FLOAT4_E2M1;
using ge::DT_FLOAT6_E2M3;
using ge::DT_FLOAT6_E3M2;
using ge::DT_FLOAT8_E4M3FN;
using ge::DT_FLOAT8_E5M2;
using ge::DT_FLOAT8_E8M0;
using ge::DT_HIFLOAT8;
using ge::DT_INT16;
using ge::DT_INT2;
using ge::DT_INT32;
using ge::DT_INT4;
using ge::DT_INT64;
using ge::DT_INT8;
using ge::DT_QINT16;
using ge::DT_QINT32;
using ge::DT_QINT8;
using ge::DT_QUINT16;
using ge::DT_QUINT8;
using ge::DT_RESOURCE;
using ge::DT_STRING;
using ge::DT_STRING_REF;
using ge::DT_UINT1;
using ge::DT_UINT16;
using ge::DT_UINT2;
using ge::DT_UINT32;
using ge::DT_UINT64;
using ge::DT_UINT8;
using ge::DT_UNDEFINED;
using ge::DT_VARIANT;

// Every struct keeps CANN's trailing reserved bytes so sizes and aggregate initialisation match.
struct IpInfo {
  AscendString ip;
  uint16_t port = 0U;
  uint8_t reserved[128];
};

struct ClusterInfo {
  uint64_t remote_cluster_id = 0U;
  int32_t remote_role_type = 0;  // informational only
  std::vector<IpInfo> local_ip_infos;
  std::vector<IpInfo> remote_ip_infos;
  uint8_t reserved[128];
};

enum class LlmRole : int32_t { kPrompt = 1, kDecoder = 2, kMix = 3, kEnd };

// Names a cache of a peer: its cluster id, its cache id, and a batch row (PullKvCache only).
struct CacheIndex {
  uint64_t cluster_id;
  int64_t cache_id;
  uint32_t batch_index;
  uint8_t reserved[128];
};

enum class CachePlacement : uint32_t {
  kHost = 0U,
  kDevice = 1U,  // served by host memory on machines without an accelerator
};

// One cache is num_tensors tensors of the same shape; shape[0] is the block (batch) dimension.
struct CacheDesc {
  CachePlacement placement = CachePlacement::kDevice;
  uint32_t num_tensors = 0U;
  DataType data_type = DT_UNDEFINED;
  std::vector<int64_t> shape;
  uint8_t reserved[128];
};

struct Cache {
  int64_t cache_id = -1;
  std::vector<uintptr_t> tensor_addrs;
  CacheDesc cache_desc;
  uint8_t reserved[128];
};

// Layer ranges are inclusive; {-1, -1} selects every layer. Layer l is tensors
// [l * tensor_num_per_layer, (l + 1) * tensor_num_per_layer).
struct KvCacheExtParam {
  std::pair<int32_t, int32_t> src_layer_range = {-1, -1};
  std::pair<int32_t, int32_t> dst_layer_range{-1, -1};
  uint8_t tensor_num_per_layer = 2U;
  uint8_t reserved[127];
};

struct RegisterCfg {
  uint8_t reserved[128] = {0};
};

class KVBLOCKS_API LlmDataDist {
 public:
  LlmDataDist(uint64_t cluster_id, LlmRole role);
  ~LlmDataDist();
  LlmDataDist(const LlmDataDist &) = delete;
  LlmDataDist &operator=(const LlmDataDist &) = delete;

  // Validates options and starts the listener when OPTION_LISTEN_IP_INFO is set.
  Status Initialize(const std::map<AscendString, AscendString> &options);
  // Tears down links, caches and threads; Initialize may be called again afterwards.
  void Finalize();
  Status SetRole(LlmRole role, const std::map<AscendString, AscendString> &options = {});

  Status LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                         int32_t timeout_in_millis = 1000);
  Status UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                           int32_t timeout_in_millis = 1000, bool force_flag = false);

  // Runtime-owned memory (shared memory, so a same-host peer can map it).
  Status AllocateCache(const CacheDesc &cache_desc, Cache &cache);
  // Unknown or already freed ids succeed.
  Status DeallocateCache(int64_t cache_id);

  Status PullKvCache(const CacheIndex &src_cache_index, const Cache &dst_cache, uint32_t batch_index = 0U,
                     int64_t size = -1, const KvCacheExtParam &ext_param = {});
  // Remote block src_blocks[i] -> local block dst_blocks[i], for every selected tensor.
  Status PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                      const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                      const KvCacheExtParam &ext_param = {});

  Status CopyKvCache(const Cache &src_cache, const Cache &dst_cache, uint32_t src_batch_index = 0U,
                     uint32_t dst_batch_index = 0U, uint64_t offset = 0U, int64_t size = -1);
  // One source list copied to several destination lists.
  Status CopyKvBlocks(const Cache &src_cache, const Cache &dst_cache, const std::vector<uint64_t> &src_blocks,
                      const std::vector<std::vector<uint64_t>> &dst_blocks_list);

  Status PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index, uint32_t src_batch_index = 0U,
                     int64_t size = -1, const KvCacheExtParam &ext_param = {});
  // Local block src_blocks[i] -> remote block dst_blocks[i], for every selected tensor.
  Status PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                      const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                      const KvCacheExtParam &ext_param = {});

  // User memory (any addresses); cfg is reserved.
  Status RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs, const RegisterCfg &cfg,
                         int64_t &cache_id);
  // Unknown ids succeed.
  Status UnregisterKvCache(int64_t cache_id);

 private:
  friend struct ::kvblocks::ImplAccess;
  class LlmDataDistImpl;
  std::unique_ptr<LlmDataDistImpl> impl_;
};

}  // namespace llm_datadist

#endif  // LLM_DATADIST_LLM_DATADIST_H_
