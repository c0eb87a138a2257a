// SPDX-License-Identifier: Apache-2.0
// kvblocks extensions as seen by the Cython core. Against a real CANN install (KVBLOCKS_WITH_CANN)
// only what CANN's public API can express is available; the rest reports LLM_FEATURE_NOT_ENABLED.
#ifndef KVBLOCKS_EXT_SHIM_H_
#define KVBLOCKS_EXT_SHIM_H_

#ifndef KVBLOCKS_WITH_CANN
#include "kvblocks/ext.h"
#else
#include <memory>
#include <string>
#include <vector>

#include "kvblocks/layout.h"
#include "kvblocks/ext_types.h"  // the same data types as the runtime build: only behaviour differs
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {
inline const char *LastErrorMessage() noexcept { return ""; }
// CANN logs through its own facility: there is no runtime log to route.
using LogCallback = void (*)(void *user, int level, const char *message);
inline void SetLogCallback(LogCallback, void *) noexcept {}
inline std::string ProcessMetricsJson() noexcept { return "[]"; }
// Asynchronous transfers are a kvblocks runtime feature: against CANN no handle is ever valid.
class TransferHandle {
 public:
  bool Valid() const noexcept { return false; }
  bool Done() const noexcept { return true; }
  llm_datadist::Status Wait(int64_t = -1) const noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  llm_datadist::Status Status() const noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  const char *Message() const noexcept { return ""; }
};
// Layer-wise pushes are a kvblocks runtime feature too.
class LayerPush {
 public:
  bool Valid() const noexcept { return false; }
  uint32_t NumLayers() const noexcept { return 0; }
  llm_datadist::Status LayerReady(uint32_t) noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  llm_datadist::Status Finish(int64_t = -1) noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  llm_datadist::Status Abort() noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  llm_datadist::Status Drain() noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  bool Done() const noexcept { return true; }
  llm_datadist::Status Status() const noexcept { return llm_datadist::LLM_FEATURE_NOT_ENABLED; }
  uint32_t LayersSent() const noexcept { return 0; }
  const char *Message() const noexcept { return ""; }
};
struct ImplAccess {
  static llm_datadist::Status AddCache(llm_datadist::LlmDataDist &dd, const llm_datadist::CacheDesc &desc,
                                       const std::vector<uint64_t> &addrs, CacheKind kind, int64_t key,
                                       llm_datadist::Cache &out) {
    if (kind != CacheKind::kMix || key >= 0) return llm_datadist::LLM_FEATURE_NOT_ENABLED;
    if (addrs.empty()) return dd.AllocateCache(desc, out);
    int64_t id = -1;
    const auto st = dd.RegisterKvCache(desc, addrs, {}, id);
    out.cache_id = id;
    out.cache_desc = desc;
    out.tensor_addrs.assign(addrs.begin(), addrs.end());
    return st;
  }
  static llm_datadist::Status FindRemoteCache(llm_datadist::LlmDataDist &, uint64_t, int64_t, int64_t &) {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status DescribeRemoteCache(llm_datadist::LlmDataDist &, uint64_t, int64_t, RemoteCacheInfo &) {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static std::string LinkPath(llm_datadist::LlmDataDist &, uint64_t) { return "cann"; }
  static llm_datadist::Status SendNotify(llm_datadist::LlmDataDist &, uint64_t, const std::string &,
                                         const std::string &, int32_t) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status GetNotifies(llm_datadist::LlmDataDist &, std::vector<NotifyMessage> &out) noexcept {
    out.clear();
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static std::shared_ptr<void> PinCacheMemory(llm_datadist::LlmDataDist &, int64_t) { return nullptr; }
  static int LinkChannels(llm_datadist::LlmDataDist &, uint64_t) { return 0; }
  static bool LastLinkFailure(llm_datadist::LlmDataDist &, uint64_t, LinkFailure &) noexcept { return false; }
  static const char *LinkFailureReasonName(LinkFailureReason) noexcept { return "other"; }
  static std::string ListenAddress(llm_datadist::LlmDataDist &) noexcept { return ""; }
  static bool HasLinks(llm_datadist::LlmDataDist &) { return false; }
  // Metrics are the kvblocks runtime's: against CANN there are none.
  static std::string MetricsJson(llm_datadist::LlmDataDist &) noexcept { return "{}"; }
  static llm_datadist::Status SetBatchKeys(llm_datadist::LlmDataDist &, int64_t, const std::vector<int64_t> &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status FindRemoteKey(llm_datadist::LlmDataDist &, uint64_t, int64_t, int64_t &,
                                            uint32_t &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status DeallocateWhenUnbound(llm_datadist::LlmDataDist &, int64_t, bool &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status UnbindKey(llm_datadist::LlmDataDist &, int64_t, int64_t, bool &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status ReleaseRemoteKey(llm_datadist::LlmDataDist &, uint64_t, int64_t, int64_t) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status PullRowToBlocks(llm_datadist::LlmDataDist &, const llm_datadist::CacheIndex &,
                                              const llm_datadist::Cache &, const std::vector<uint64_t> &,
                                              const llm_datadist::KvCacheExtParam &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status PullKvBlocksAsync(llm_datadist::LlmDataDist &, const llm_datadist::CacheIndex &,
                                                const llm_datadist::Cache &, const std::vector<uint64_t> &,
                                                const std::vector<uint64_t> &, const llm_datadist::KvCacheExtParam &,
                                                TransferHandle &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status PushKvBlocksAsync(llm_datadist::LlmDataDist &, const llm_datadist::Cache &,
                                                const llm_datadist::CacheIndex &, const std::vector<uint64_t> &,
                                                const std::vector<uint64_t> &, const llm_datadist::KvCacheExtParam &,
                                                TransferHandle &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status SubmitBlocksBatch(llm_datadist::LlmDataDist &, const std::vector<BlocksRequest> &,
                                                std::vector<TransferHandle> &, size_t &failed) noexcept {
    failed = 0;
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status OpenLayerPush(llm_datadist::LlmDataDist &, const llm_datadist::Cache &,
                                            const llm_datadist::CacheIndex &, const std::vector<uint64_t> &,
                                            const std::vector<uint64_t> &, uint8_t, LayerPush &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status OpenLayerPushPieces(llm_datadist::LlmDataDist &, const llm_datadist::Cache &, uint64_t,
                                                  uint32_t, const std::vector<LayerPiece> &, bool,
                                                  LayerPush &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  // Layout transforms and prepared transfers are a kvblocks runtime feature.
  static llm_datadist::Status PrepareBlocksTransfer(llm_datadist::LlmDataDist &, const BlocksRequest &,
                                                    const LayoutTransform *, PreparedTransfer &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status ExecutePrepared(llm_datadist::LlmDataDist &, const PreparedTransfer &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static llm_datadist::Status ExecutePreparedAsync(llm_datadist::LlmDataDist &, const PreparedTransfer &,
                                                   TransferHandle &) noexcept {
    return llm_datadist::LLM_FEATURE_NOT_ENABLED;
  }
  static PreparedInfo DescribePrepared(const PreparedTransfer &) noexcept { return PreparedInfo(); }
};
}  // namespace kvblocks
#endif

namespace kvblocks {
// Transfers from raw block arrays for nogil callers (the cimport API): never throw, so an
// allocation failure is a status, not a crash.
inline llm_datadist::Status PullBlocksRaw(llm_datadist::LlmDataDist &dd, const llm_datadist::CacheIndex &src,
                                          const llm_datadist::Cache &dst, const uint64_t *sb, const uint64_t *db,
                                          size_t n, const llm_datadist::KvCacheExtParam &ext) noexcept {
  try {
    return dd.PullKvBlocks(src, dst, std::vector<uint64_t>(sb, sb + n), std::vector<uint64_t>(db, db + n), ext);
  } catch (const std::bad_alloc &) {
    return llm_datadist::LLM_OUT_OF_MEMORY;
  } catch (...) {
    return llm_datadist::LLM_FAILED;
  }
}
inline llm_datadist::Status PushBlocksRaw(llm_datadist::LlmDataDist &dd, const llm_datadist::Cache &src,
                                          const llm_datadist::CacheIndex &dst, const uint64_t *sb, const uint64_t *db,
                                          size_t n, const llm_datadist::KvCacheExtParam &ext) noexcept {
  try {
    return dd.PushKvBlocks(src, dst, std::vector<uint64_t>(sb, sb + n), std::vector<uint64_t>(db, db + n), ext);
  } catch (const std::bad_alloc &) {
    return llm_datadist::LLM_OUT_OF_MEMORY;
  } catch (...) {
    return llm_datadist::LLM_FAILED;
  }
}
// Asynchronous transfers from raw block arrays (the cimport API); never throw.
inline llm_datadist::Status PullBlocksAsyncRaw(llm_datadist::LlmDataDist &dd, const llm_datadist::CacheIndex &src,
                                               const llm_datadist::Cache &dst, const uint64_t *sb, const uint64_t *db,
                                               size_t n, const llm_datadist::KvCacheExtParam &ext,
                                               TransferHandle &out) noexcept {
  try {
    return ImplAccess::PullKvBlocksAsync(dd, src, dst, std::vector<uint64_t>(sb, sb + n),
                                         std::vector<uint64_t>(db, db + n), ext, out);
  } catch (const std::bad_alloc &) {
    return llm_datadist::LLM_OUT_OF_MEMORY;
  } catch (...) {
    return llm_datadist::LLM_FAILED;
  }
}
inline llm_datadist::Status PushBlocksAsyncRaw(llm_datadist::LlmDataDist &dd, const llm_datadist::Cache &src,
                                               const llm_datadist::CacheIndex &dst, const uint64_t *sb,
                                               const uint64_t *db, size_t n, const llm_datadist::KvCacheExtParam &ext,
                                               TransferHandle &out) noexcept {
  try {
    return ImplAccess::PushKvBlocksAsync(dd, src, dst, std::vector<uint64_t>(sb, sb + n),
                                         std::vector<uint64_t>(db, db + n), ext, out);
  } catch (const std::bad_alloc &) {
    return llm_datadist::LLM_OUT_OF_MEMORY;
  } catch (...) {
    return llm_datadist::LLM_FAILED;
  }
}
// A layer-wise push from raw block arrays (the cimport API); never throws.
inline llm_datadist::Status OpenLayerPushRaw(llm_datadist::LlmDataDist &dd, const llm_datadist::Cache &src,
                                             const llm_datadist::CacheIndex &dst, const uint64_t *sb,
                                             const uint64_t *db, size_t n, uint8_t tnpl, LayerPush &out) noexcept {
  try {
    return ImplAccess::OpenLayerPush(dd, src, dst, std::vector<uint64_t>(sb, sb + n),
                                     std::vector<uint64_t>(db, db + n), tnpl, out);
  } catch (const std::bad_alloc &) {
    return llm_datadist::LLM_OUT_OF_MEMORY;
  } catch (...) {
    return llm_datadist::LLM_FAILED;
  }
}
}  // namespace kvblocks

#endif  // KVBLOCKS_EXT_SHIM_H_
