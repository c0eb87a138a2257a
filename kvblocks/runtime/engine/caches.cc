// SPDX-License-Identifier: Apache-2.0
// Cache registration and allocation. Ids start at 1 and are never reused.
#include <algorithm>

#include "common/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "wire/messages.h"

namespace kvblocks {

Status Impl::AddCache(const CacheDesc &desc, const std::vector<uint64_t> &addrs, CacheKind kind, int64_t key,
                      Cache *out, bool allocate) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  if (allocate) {
    if (desc.num_tensors == 0) return Fail(LLM_PARAM_INVALID, "cache_desc.num_tensors is 0");
  } else {
    if (addrs.empty() || addrs.size() != desc.num_tensors)
      return Fail(LLM_PARAM_INVALID, "%zu addresses for cache_desc.num_tensors=%u", addrs.size(), desc.num_tensors);
    for (size_t i = 0; i < addrs.size(); ++i)
      if (addrs[i] == 0) return Fail(LLM_PARAM_INVALID, "addrs[%zu] is 0", i);
  }
  const int64_t tensor_bytes =
      TensorBytes(static_cast<int64_t>(desc.data_type), desc.shape.data(), desc.shape.size());
  if (tensor_bytes <= 0)
    return Fail(LLM_PARAM_INVALID, "cache_desc: shape (%zu dims) or data_type %d gives no valid tensor size",
                desc.shape.size(), static_cast<int>(desc.data_type));
  if (desc.placement != CachePlacement::kHost && desc.placement != CachePlacement::kDevice)
    return Fail(LLM_PARAM_INVALID, "cache_desc.placement %d is not HOST (0) or DEVICE (1)",
                static_cast<int>(desc.placement));

  auto e = std::make_shared<CacheEntry>();
  e->kind = kind;
  e->key = key;
  e->desc = desc;
  e->num_tensors = desc.num_tensors;
  e->tensor_bytes = static_cast<uint64_t>(tensor_bytes);
  const uint64_t dim0 = static_cast<uint64_t>(desc.shape[0]);
  switch (kind) {
    case CacheKind::kMix:
      e->num_blocks = e->batch_size = dim0;
      break;
    case CacheKind::kBlocks:
      e->num_blocks = dim0;
      e->batch_size = 1;
      break;
    case CacheKind::kCache:
      e->num_blocks = 0;
      e->batch_size = dim0;
      break;
  }
  e->stride = e->tensor_bytes / dim0;
  if (e->stride == 0)  // sub-byte types: a block must be at least one byte
    return Fail(LLM_PARAM_INVALID, "a block of shape[1:] is smaller than one byte");
  if (allocate) {
    // One memfd for all tensors, each page-aligned, so a same-host peer maps it with one mmap.
    e->pitch = (e->tensor_bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    uint64_t total;
    if (__builtin_mul_overflow(e->pitch, static_cast<uint64_t>(desc.num_tensors), &total))
      return Fail(LLM_PARAM_INVALID, "cache size overflows");
    e->region = SharedRegion::Create(total);
    if (!e->region)
      return Fail(desc.placement == CachePlacement::kDevice ? LLM_DEVICE_OUT_OF_MEMORY : LLM_OUT_OF_MEMORY,
                  "cannot allocate %llu bytes", static_cast<unsigned long long>(total));
    for (uint32_t i = 0; i < desc.num_tensors; ++i)
      e->addrs.push_back(reinterpret_cast<uint64_t>(e->region->base + i * e->pitch));
  } else {
    e->addrs = addrs;
  }
  caches_.Add(e);
  if (out != nullptr) {
    out->cache_id = e->id;
    out->tensor_addrs.assign(e->addrs.begin(), e->addrs.end());
    out->cache_desc = desc;
  }
  return LLM_SUCCESS;
}

Status Impl::RemoveCache(int64_t cache_id) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  std::shared_ptr<CacheEntry> e = caches_.Take(cache_id);
  if (!e) return LLM_SUCCESS;
  // Wait for transfers and serving threads still using it; the memory goes with the last owner.
  RetireCache(e.get());
  NotifyCacheGone(cache_id);
  return LLM_SUCCESS;
}

// Same-host peers may read and write this cache's memory directly (mapped memfd, CMA). Before the
// caller may free it, each must confirm it stopped: CACHE_GONE waits for their in-flight copies.
// Bounded by llm.SyncKvCacheWaitTime per call; a peer that does not answer in time is unlinked.
void Impl::NotifyCacheGone(int64_t cache_id) {
  std::vector<std::shared_ptr<struct Link>> peers = links_.SameHostAlive();
  if (peers.empty()) return;
  std::string ref;
  Encode(CacheRef{cache_id}, &ref);
  const int64_t deadline = NowNs() + std::max<int64_t>(wait_time_ms_, 1) * 1000000LL;
  std::vector<std::shared_ptr<struct Link>> sent;
  for (auto &l : peers)
    if (l->SendCtrl(kCacheGone, deadline, ref)) sent.push_back(l);
  for (auto &l : sent) {
    std::unique_lock<std::mutex> g(l->mu);
    while (l->alive.load() && l->gone_acked.count(cache_id) == 0) {
      const int64_t left = deadline - NowNs();
      if (left <= 0) break;
      l->cv.wait_for(g, std::chrono::nanoseconds(left));
    }
    const bool acked = l->gone_acked.erase(cache_id) != 0;
    g.unlock();
    if (!acked && l->alive.load()) {
      LogWarn("cluster %llu did not confirm it stopped using cache %lld; unlinking it",
              static_cast<unsigned long long>(l->remote_cluster_id), static_cast<long long>(cache_id));
      DropLink(l);
    }
  }
}

}  // namespace kvblocks
