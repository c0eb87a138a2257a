// SPDX-License-Identifier: Apache-2.0
// llm_datadist::LlmDataDist: the CANN-compatible facade over kvblocks::Impl.
#include <exception>

#include "common/error.h"
#include "engine/engine.h"

namespace llm_datadist {

using kvblocks::CacheKind;
using kvblocks::Fail;

namespace {
// No C++ exception crosses the CANN-style status API (callers include Cython nogil code), and
// every call starts with a clear last error.
template <typename F>
Status Guard(F &&f) noexcept {
  kvblocks::ClearLastError();
  try {
    return f();
  } catch (const std::bad_alloc &) {
    return Fail(LLM_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    return Fail(LLM_FAILED, "internal error: %s", e.what());
  } catch (...) {
    return Fail(LLM_FAILED, "internal error");
  }
}
}  // namespace

class LlmDataDist::LlmDataDistImpl : public kvblocks::Impl {
 public:
  using kvblocks::Impl::Impl;
};

LlmDataDist::LlmDataDist(uint64_t cluster_id, LlmRole role) : impl_(new LlmDataDistImpl(cluster_id, role)) {}
LlmDataDist::~LlmDataDist() = default;

Status LlmDataDist::Initialize(const std::map<AscendString, AscendString> &options) {
  return Guard([&] { return impl_->Initialize(options); });
}
void LlmDataDist::Finalize() {
  Guard([&] {
    impl_->Finalize();
    return LLM_SUCCESS;
  });
}
Status LlmDataDist::SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
  return Guard([&] { return impl_->SetRole(role, options); });
}
Status LlmDataDist::LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                    int32_t timeout_in_millis) {
  return Guard([&] { return impl_->Link(clusters, rets, timeout_in_millis); });
}
Status LlmDataDist::UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                                      int32_t timeout_in_millis, bool force_flag) {
  return Guard([&] { return impl_->Unlink(clusters, rets, timeout_in_millis, force_flag); });
}
Status LlmDataDist::AllocateCache(const CacheDesc &cache_desc, Cache &cache) {
  return Guard([&] { return impl_->AddCache(cache_desc, {}, CacheKind::kMix, -1, &cache, true); });
}
Status LlmDataDist::DeallocateCache(int64_t cache_id) {
  return Guard([&] { return impl_->RemoveCache(cache_id); });
}
Status LlmDataDist::PullKvCache(const CacheIndex &src_cache_index, const Cache &dst_cache, uint32_t batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  return Guard([&] { return impl_->PullCache(src_cache_index, dst_cache, batch_index, size, ext_param); });
}
Status LlmDataDist::PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  return Guard([&] { return impl_->PullBlocks(src_cache_index, dst_cache, src_blocks, dst_blocks, ext_param); });
}
Status LlmDataDist::CopyKvCache(const Cache &src_cache, const Cache &dst_cache, uint32_t src_batch_index,
                                uint32_t dst_batch_index, uint64_t offset, int64_t size) {
  return Guard([&] { return impl_->CopyCache(src_cache, dst_cache, src_batch_index, dst_batch_index, offset, size); });
}
Status LlmDataDist::CopyKvBlocks(const Cache &src_cache, const Cache &dst_cache,
                                 const std::vector<uint64_t> &src_blocks,
                                 const std::vector<std::vector<uint64_t>> &dst_blocks_list) {
  return Guard([&] { return impl_->CopyBlocks(src_cache, dst_cache, src_blocks, dst_blocks_list); });
}
Status LlmDataDist::PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index, uint32_t src_batch_index,
                                int64_t size, const KvCacheExtParam &ext_param) {
  return Guard([&] { return impl_->PushCache(src_cache, dst_cache_index, src_batch_index, size, ext_param); });
}
Status LlmDataDist::PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const KvCacheExtParam &ext_param) {
  return Guard([&] { return impl_->PushBlocks(src_cache, dst_cache_index, src_blocks, dst_blocks, ext_param); });
}
Status LlmDataDist::RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs,
                                    const RegisterCfg &cfg, int64_t &cache_id) {
  (void)cfg;
  Cache out;
  const Status st = Guard([&] { return impl_->AddCache(cache_desc, addrs, CacheKind::kMix, -1, &out, false); });
  if (st == LLM_SUCCESS) cache_id = out.cache_id;
  return st;
}
Status LlmDataDist::UnregisterKvCache(int64_t cache_id) {
  return Guard([&] { return impl_->RemoveCache(cache_id); });
}

}  // namespace llm_datadist

namespace kvblocks {

Status ImplAccess::AddCache(llm_datadist::LlmDataDist &dd, const CacheDesc &desc, const std::vector<uint64_t> &addrs,
                            CacheKind kind, int64_t key, Cache &out) {
  return llm_datadist::Guard([&] { return dd.impl_->AddCache(desc, addrs, kind, key, &out, addrs.empty()); });
}
Status ImplAccess::FindRemoteCache(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t key,
                                   int64_t &cache_id) {
  return llm_datadist::Guard([&] { return dd.impl_->FindRemoteCache(cluster_id, key, &cache_id); });
}
Status ImplAccess::DescribeRemoteCache(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t cache_id,
                                       RemoteCacheInfo &out) {
  return llm_datadist::Guard([&] { return dd.impl_->DescribeRemoteCache(cluster_id, cache_id, &out); });
}
// Introspection: on an internal failure (out of memory) these report "nothing" rather than throw.
std::string ImplAccess::LinkPath(llm_datadist::LlmDataDist &dd, uint64_t cluster_id) noexcept {
  try {
    return dd.impl_->LinkPath(cluster_id);
  } catch (...) {
    return std::string();
  }
}
std::shared_ptr<void> ImplAccess::PinCacheMemory(llm_datadist::LlmDataDist &dd, int64_t cache_id) noexcept {
  try {
    return dd.impl_->PinCacheMemory(cache_id);
  } catch (...) {
    return nullptr;
  }
}
Status ImplAccess::SetBatchKeys(llm_datadist::LlmDataDist &dd, int64_t cache_id, const std::vector<int64_t> &keys) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->SetBatchKeys(cache_id, keys); });
}
Status ImplAccess::FindRemoteKey(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t key, int64_t &cache_id,
                                 uint32_t &batch_index) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->FindRemoteKey(cluster_id, key, &cache_id, &batch_index); });
}
Status ImplAccess::DeallocateWhenUnbound(llm_datadist::LlmDataDist &dd, int64_t cache_id, bool &deferred) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->DeallocateWhenUnbound(cache_id, &deferred); });
}
Status ImplAccess::UnbindKey(llm_datadist::LlmDataDist &dd, int64_t cache_id, int64_t key, bool &was_bound) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->UnbindKey(cache_id, key, &was_bound); });
}
Status ImplAccess::ReleaseRemoteKey(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t cache_id,
                                    int64_t key) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->ReleaseRemoteKey(cluster_id, cache_id, key); });
}
Status ImplAccess::PullRowToBlocks(llm_datadist::LlmDataDist &dd, const CacheIndex &src, const Cache &dst,
                                   const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->PullRowToBlocks(src, dst, dst_blocks, ext); });
}
bool ImplAccess::HasLinks(llm_datadist::LlmDataDist &dd) noexcept {
  try {
    return dd.impl_->HasLinks();
  } catch (...) {
    return false;
  }
}
int ImplAccess::LinkChannels(llm_datadist::LlmDataDist &dd, uint64_t cluster_id) noexcept {
  try {
    return dd.impl_->LinkChannels(cluster_id);
  } catch (...) {
    return 0;
  }
}
EngineMetrics ImplAccess::Metrics(llm_datadist::LlmDataDist &dd) noexcept {
  EngineMetrics m;
  try {
    dd.impl_->Metrics(&m);
  } catch (...) {
    m.peers.clear();
  }
  return m;
}
std::string ImplAccess::MetricsJson(llm_datadist::LlmDataDist &dd) noexcept {
  std::string s = kvblocks::MetricsJson({Metrics(dd)});  // "[{...}]"
  return s.size() >= 2 ? s.substr(1, s.size() - 2) : "{}";
}

}  // namespace kvblocks

// ------------------------------------------------------------------ asynchronous transfers
namespace kvblocks {

Status ImplAccess::PullKvBlocksAsync(llm_datadist::LlmDataDist &dd, const CacheIndex &src_cache_index,
                                     const Cache &dst_cache, const std::vector<uint64_t> &src_blocks,
                                     const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext_param,
                                     TransferHandle &out) noexcept {
  return llm_datadist::Guard(
      [&] { return dd.impl_->SubmitOne(true, src_cache_index, dst_cache, src_blocks, dst_blocks, ext_param, &out); });
}

Status ImplAccess::PushKvBlocksAsync(llm_datadist::LlmDataDist &dd, const Cache &src_cache,
                                     const CacheIndex &dst_cache_index, const std::vector<uint64_t> &src_blocks,
                                     const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext_param,
                                     TransferHandle &out) noexcept {
  return llm_datadist::Guard(
      [&] { return dd.impl_->SubmitOne(false, dst_cache_index, src_cache, src_blocks, dst_blocks, ext_param, &out); });
}

Status ImplAccess::SubmitBlocksBatch(llm_datadist::LlmDataDist &dd, const std::vector<BlocksRequest> &requests,
                                     std::vector<TransferHandle> &out, size_t &failed) noexcept {
  return llm_datadist::Guard([&] {
    failed = 0;
    std::vector<TransferHandle> handles(requests.size());
    if (requests.empty()) return Fail(LLM_PARAM_INVALID, "the batch is empty");
    const Status st = dd.impl_->SubmitBlocks(requests.data(), requests.size(), handles.data(), &failed);
    if (st == LLM_SUCCESS) out.swap(handles);
    return st;
  });
}

Status ImplAccess::SendNotify(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, const std::string &name,
                              const std::string &message, int32_t timeout_ms) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->SendNotify(cluster_id, name, message, timeout_ms); });
}
Status ImplAccess::GetNotifies(llm_datadist::LlmDataDist &dd, std::vector<NotifyMessage> &out) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->GetNotifies(&out); });
}

}  // namespace kvblocks

// ------------------------------------------------------------------ layer-wise pushes
namespace kvblocks {

Status ImplAccess::OpenLayerPush(llm_datadist::LlmDataDist &dd, const Cache &src_cache,
                                 const CacheIndex &dst_cache_index, const std::vector<uint64_t> &src_blocks,
                                 const std::vector<uint64_t> &dst_blocks, uint8_t tensor_num_per_layer,
                                 LayerPush &out) noexcept {
  return llm_datadist::Guard([&] {
    return dd.impl_->OpenLayerPush(src_cache, dst_cache_index, src_blocks, dst_blocks, tensor_num_per_layer, &out);
  });
}

Status ImplAccess::OpenLayerPushPieces(llm_datadist::LlmDataDist &dd, const Cache &src_cache, uint64_t dst_cluster_id,
                                       uint32_t num_layers, const std::vector<LayerPiece> &pieces,
                                       bool per_layer_deadline, LayerPush &out) noexcept {
  return llm_datadist::Guard([&] {
    return dd.impl_->OpenLayerPushPieces(src_cache, dst_cluster_id, num_layers, pieces, per_layer_deadline, &out);
  });
}

bool ImplAccess::LastLinkFailure(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, LinkFailure &out) noexcept {
  try {
    return dd.impl_->LastLinkFailure(cluster_id, &out);
  } catch (...) {
    return false;
  }
}
const char *ImplAccess::LinkFailureReasonName(LinkFailureReason reason) noexcept { return LinkReasonName(reason); }
std::string ImplAccess::ListenAddress(llm_datadist::LlmDataDist &dd) noexcept {
  try {
    return dd.impl_->ListenAddress();
  } catch (...) {
    return std::string();
  }
}

Status ImplAccess::PrepareBlocksTransfer(llm_datadist::LlmDataDist &dd, const BlocksRequest &request,
                                         const LayoutTransform *layout, PreparedTransfer &out) noexcept {
  return llm_datadist::Guard([&] { return dd.impl_->PrepareTransfer(request, layout, &out); });
}

Status ImplAccess::ExecutePrepared(llm_datadist::LlmDataDist &dd, const PreparedTransfer &p) noexcept {
  return llm_datadist::Guard([&] {
    return p.Valid() ? dd.impl_->ExecutePrepared(*p.state()) : Fail(LLM_PARAM_INVALID, "the prepared transfer is empty");
  });
}

Status ImplAccess::ExecutePreparedAsync(llm_datadist::LlmDataDist &dd, const PreparedTransfer &p,
                                        TransferHandle &out) noexcept {
  return llm_datadist::Guard([&] {
    return p.Valid() ? dd.impl_->ExecutePreparedAsync(*p.state(), &out)
                     : Fail(LLM_PARAM_INVALID, "the prepared transfer is empty");
  });
}

PreparedInfo ImplAccess::DescribePrepared(const PreparedTransfer &p) noexcept {
  return p.Valid() ? kvblocks::DescribePrepared(*p.state()) : PreparedInfo();
}

}  // namespace kvblocks
