// SPDX-License-Identifier: Apache-2.0
// Cache registration and allocation. Ids start at 1 and are never reused.
#include <algorithm>
#include <chrono>
#include <set>

#include "common/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "transport/registry.h"
#include "wire/messages.h"

namespace kvblocks {

namespace {
// Bytes an element is aligned to inside an allocated cache: its size rounded up to a power of two,
// between 1 (sub-byte types) and 16.
uint64_t ElementAlign(int64_t data_type) {
  const uint64_t bytes = static_cast<uint64_t>((DataTypeBits(data_type) + 7) / 8);
  uint64_t a = 1;
  while (a < bytes && a < 16) a <<= 1;
  return a;
}
}  // namespace

Status Impl::SetBatchKeys(int64_t cache_id, const std::vector<int64_t> &keys) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  auto e = caches_.Find(cache_id);
  if (!e) return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld does not exist", static_cast<long long>(cache_id));
  if (keys.size() > e->batch_size)
    return Fail(LLM_PARAM_INVALID, "%zu keys for %llu batch rows", keys.size(), (unsigned long long)e->batch_size);
  std::unique_lock<std::shared_timed_mutex> hold(table_mu_);  // no handshake is reading the entry
  e->batch_keys = keys;
  return LLM_SUCCESS;
}

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
    // One memfd for all tensors, packed at the element alignment (not a page each: 2^18 one-byte
    // tensors take 256 KiB, not 1 GiB), so a same-host peer maps it with one mmap.
    const uint64_t align = ElementAlign(static_cast<int64_t>(desc.data_type));
    e->pitch = (e->tensor_bytes + align - 1) / align * align;
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
  return RemoveCacheHeld(cache_id);
}

Status Impl::RemoveCacheHeld(int64_t cache_id) {
  std::shared_ptr<CacheEntry> e = caches_.Find(cache_id);
  if (!e) return LLM_SUCCESS;
  std::lock_guard<std::mutex> one(e->remove_mu);
  if (e->removed) return LLM_SUCCESS;  // a concurrent unregister finished it
  // One budget for the whole call. New transfers and new links stop seeing the cache first; then
  // every same-host peer confirms its one-sided copies into it ended; only then is it removed.
  const int64_t deadline = NowNs() + std::max<int64_t>(wait_time_ms_, 1) * kMsNs;
  e->closing.store(true);
  {
    // Handshakes that snapshotted our table before `closing` register their link first.
    std::unique_lock<std::shared_timed_mutex> barrier(table_mu_, std::defer_lock);
    if (!barrier.try_lock_for(std::chrono::nanoseconds(std::max<int64_t>(deadline - NowNs(), 0)))) {
      e->closing.store(false);
      return Fail(LLM_TIMEOUT, "a link handshake in progress did not finish within llm.SyncKvCacheWaitTime; "
                  "cache %lld stays registered", static_cast<long long>(cache_id));
    }
  }
  const Status st = NotifyCacheGone(cache_id, deadline);
  if (st != LLM_SUCCESS) {
    e->closing.store(false);  // still registered: the caller keeps the memory alive
    return st;
  }
  // Local transfers end by their own deadlines (at most one budget from now); serving threads
  // still at it when ours passes have their channels shut down.
  RetireCache(e.get(), deadline);
  UnregisterEverywhere(e.get());  // peers confirmed (CACHE_GONE) they stopped; the caller may free it now
  caches_.Take(cache_id);
  return LLM_SUCCESS;
}

// Same-host peers may read and write this cache's memory directly (a mapped memfd, process_vm_*, another
// engine of this process). Before the caller may free it, each must confirm it stopped:
// CACHE_GONE waits for their in-flight copies. A peer that does not confirm by `deadline` fails
// the call with LLM_TIMEOUT; it stays linked, so a later retry completes once it answers. Links
// that finish a handshake meanwhile (they may have seen the cache) are asked too.
Status Impl::NotifyCacheGone(int64_t cache_id, int64_t deadline) {
  std::string ref;
  Encode(CacheRef{cache_id}, &ref);
  std::set<struct Link *> asked;
  for (;;) {
    std::vector<std::shared_ptr<struct Link>> sent;
    for (auto &l : links_.SameHostAlive()) {
      if (!asked.insert(l.get()).second) continue;
      {
        std::lock_guard<std::mutex> g(l->mu);
        if (l->gone_acked.count(cache_id) != 0) continue;  // confirmed to an earlier, failed call
      }
      if (l->SendCtrl(kCacheGone, deadline, ref)) sent.push_back(l);
    }
    if (sent.empty()) return LLM_SUCCESS;
    for (auto &l : sent) {
      std::unique_lock<std::mutex> g(l->mu);
      while (l->alive.load() && l->gone_acked.count(cache_id) == 0) {
        const int64_t left = deadline - NowNs();
        if (left <= 0) break;
        l->cv.wait_for(g, std::chrono::nanoseconds(left));
      }
      // A link that died meanwhile: the peer closed its control connection (exit, unlink).
      if (l->alive.load() && l->gone_acked.count(cache_id) == 0) {
        g.unlock();
        LogWarn("cluster %llu did not confirm it stopped using cache %lld", (unsigned long long)l->remote_cluster_id,
                (long long)cache_id);
        return Fail(LLM_TIMEOUT,
                    "cluster %llu did not confirm within llm.SyncKvCacheWaitTime=%lld ms that it stopped using "
                    "cache %lld; the cache stays registered (retry once the peer answers)",
                    (unsigned long long)l->remote_cluster_id, (long long)wait_time_ms_, (long long)cache_id);
      }
    }
  }
}

}  // namespace kvblocks
