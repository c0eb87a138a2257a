// SPDX-License-Identifier: Apache-2.0
// kvblocks extensions as seen by the Cython core. Against a real CANN install (KVBLOCKS_WITH_CANN)
// only what CANN's public API can express is available; the rest reports LLM_FEATURE_NOT_ENABLED.
// That build has no kvblocks runtime to link to: every kvblocks function the core can reach is defined
// here, inline (tests/test_cann_style_build.py compiles the core so and fails on one left undefined).
#ifndef KVBLOCKS_EXT_SHIM_H_
#define KVBLOCKS_EXT_SHIM_H_

#ifdef KVBLOCKS_WITH_CANN
#include "llm_datadist/llm_datadist.h"  // CANN's own: it knows nothing of kvblocks' export macro
#ifndef KVBLOCKS_API
#define KVBLOCKS_API
#endif
#endif
// Both builds see the runtime's own declarations (ext.h and the headers it includes): the CANN build only
// defines them below, so a call or type the core uses cannot be missing from one build.
#include "kvblocks/ext.h"

#ifdef KVBLOCKS_WITH_CANN
namespace kvblocks {
namespace cann {
constexpr llm_datadist::Status kNo = llm_datadist::LLM_FEATURE_NOT_ENABLED;
}  // namespace cann

inline const char *LastErrorMessage() noexcept { return ""; }
// CANN logs through its own facility: there is no runtime log to route.
inline void SetLogCallback(LogCallback, void *) noexcept {}
// Metrics are the kvblocks runtime's: against CANN there are none.
inline std::vector<EngineMetrics> ProcessMetrics() noexcept { return {}; }
inline std::string MetricsJson(const std::vector<EngineMetrics> &) noexcept { return "[]"; }

// Asynchronous transfers and layer-wise pushes are kvblocks runtime features: against CANN no handle
// is ever valid (nothing constructs one with a state).
inline bool TransferHandle::Done() const noexcept { return true; }
inline llm_datadist::Status TransferHandle::Wait(int64_t) const noexcept { return cann::kNo; }
inline llm_datadist::Status TransferHandle::Status() const noexcept { return cann::kNo; }
inline const char *TransferHandle::Message() const noexcept { return ""; }
inline uint32_t LayerPush::NumLayers() const noexcept { return 0; }
inline llm_datadist::Status LayerPush::LayerReady(uint32_t) noexcept { return cann::kNo; }
inline llm_datadist::Status LayerPush::Finish(int64_t) noexcept { return cann::kNo; }
inline llm_datadist::Status LayerPush::Abort() noexcept { return cann::kNo; }
inline llm_datadist::Status LayerPush::Drain() noexcept { return cann::kNo; }
inline bool LayerPush::Done() const noexcept { return true; }
inline llm_datadist::Status LayerPush::Status() const noexcept { return cann::kNo; }
inline uint32_t LayerPush::LayersSent() const noexcept { return 0; }
inline const char *LayerPush::Message() const noexcept { return ""; }

// Only what CANN's public API can express works; every other extension is LLM_FEATURE_NOT_ENABLED.
inline llm_datadist::Status ImplAccess::AddCache(llm_datadist::LlmDataDist &dd, const llm_datadist::CacheDesc &desc,
                                                 const std::vector<uint64_t> &addrs, CacheKind kind, int64_t key,
                                                 llm_datadist::Cache &out) {
  if (kind != CacheKind::kMix || key >= 0) return cann::kNo;
  if (addrs.empty()) return dd.AllocateCache(desc, out);
  int64_t id = -1;
  const auto st = dd.RegisterKvCache(desc, addrs, {}, id);
  out.cache_id = id;
  out.cache_desc = desc;
  out.tensor_addrs.assign(addrs.begin(), addrs.end());
  return st;
}
inline llm_datadist::Status ImplAccess::FindRemoteCache(llm_datadist::LlmDataDist &, uint64_t, int64_t, int64_t &) {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::DescribeRemoteCache(llm_datadist::LlmDataDist &, uint64_t, int64_t,
                                                            RemoteCacheInfo &) {
  return cann::kNo;
}
inline std::string ImplAccess::LinkPath(llm_datadist::LlmDataDist &, uint64_t) noexcept { return "cann"; }
inline std::shared_ptr<void> ImplAccess::PinCacheMemory(llm_datadist::LlmDataDist &, int64_t) noexcept {
  return nullptr;
}
inline llm_datadist::Status ImplAccess::SetBatchKeys(llm_datadist::LlmDataDist &, int64_t,
                                                     const std::vector<int64_t> &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::FindRemoteKey(llm_datadist::LlmDataDist &, uint64_t, int64_t, int64_t &,
                                                      uint32_t &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::DeallocateWhenUnbound(llm_datadist::LlmDataDist &, int64_t, bool &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::UnbindKey(llm_datadist::LlmDataDist &, int64_t, int64_t, bool &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::ReleaseRemoteKey(llm_datadist::LlmDataDist &, uint64_t, int64_t,
                                                         int64_t) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::PullRowToBlocks(llm_datadist::LlmDataDist &, const llm_datadist::CacheIndex &,
                                                        const llm_datadist::Cache &, const std::vector<uint64_t> &,
                                                        const llm_datadist::KvCacheExtParam &) noexcept {
  return cann::kNo;
}
inline bool ImplAccess::HasLinks(llm_datadist::LlmDataDist &) noexcept { return false; }
inline int ImplAccess::LinkChannels(llm_datadist::LlmDataDist &, uint64_t) noexcept { return 0; }
inline bool ImplAccess::LastLinkFailure(llm_datadist::LlmDataDist &, uint64_t, LinkFailure &) noexcept {
  return false;
}
inline const char *ImplAccess::LinkFailureReasonName(LinkFailureReason) noexcept { return "other"; }
inline std::string ImplAccess::ListenAddress(llm_datadist::LlmDataDist &) noexcept { return ""; }
inline EngineMetrics ImplAccess::Metrics(llm_datadist::LlmDataDist &) noexcept { return {}; }
inline std::string ImplAccess::MetricsJson(llm_datadist::LlmDataDist &) noexcept { return "{}"; }
inline llm_datadist::Status ImplAccess::PullKvBlocksAsync(llm_datadist::LlmDataDist &,
                                                          const llm_datadist::CacheIndex &,
                                                          const llm_datadist::Cache &, const std::vector<uint64_t> &,
                                                          const std::vector<uint64_t> &,
                                                          const llm_datadist::KvCacheExtParam &,
                                                          TransferHandle &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::PushKvBlocksAsync(llm_datadist::LlmDataDist &, const llm_datadist::Cache &,
                                                          const llm_datadist::CacheIndex &,
                                                          const std::vector<uint64_t> &,
                                                          const std::vector<uint64_t> &,
                                                          const llm_datadist::KvCacheExtParam &,
                                                          TransferHandle &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::SubmitBlocksBatch(llm_datadist::LlmDataDist &,
                                                          const std::vector<BlocksRequest> &,
                                                          std::vector<TransferHandle> &, size_t &failed) noexcept {
  failed = 0;
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::SendNotify(llm_datadist::LlmDataDist &, uint64_t, const std::string &,
                                                   const std::string &, int32_t) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::GetNotifies(llm_datadist::LlmDataDist &,
                                                    std::vector<NotifyMessage> &out) noexcept {
  out.clear();
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::OpenLayerPush(llm_datadist::LlmDataDist &, const llm_datadist::Cache &,
                                                      const llm_datadist::CacheIndex &, const std::vector<uint64_t> &,
                                                      const std::vector<uint64_t> &, uint8_t, LayerPush &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::OpenLayerPushPieces(llm_datadist::LlmDataDist &, const llm_datadist::Cache &,
                                                            uint64_t, uint32_t, const std::vector<LayerPiece> &, bool,
                                                            LayerPush &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::PrepareBlocksTransfer(llm_datadist::LlmDataDist &, const BlocksRequest &,
                                                              const LayoutTransform *, PreparedTransfer &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::ExecutePrepared(llm_datadist::LlmDataDist &,
                                                        const PreparedTransfer &) noexcept {
  return cann::kNo;
}
inline llm_datadist::Status ImplAccess::ExecutePreparedAsync(llm_datadist::LlmDataDist &, const PreparedTransfer &,
                                                             TransferHandle &) noexcept {
  return cann::kNo;
}
inline PreparedInfo ImplAccess::DescribePrepared(const PreparedTransfer &) noexcept { return PreparedInfo(); }
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
