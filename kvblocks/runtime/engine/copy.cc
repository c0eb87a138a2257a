// SPDX-License-Identifier: Apache-2.0
// CopyKvBlocks / CopyKvCache between two caches of this engine (CANN V1 rules).
#include <algorithm>
#include <memory>
#include <string>

#include "common/error.h"
#include "engine/engine.h"
#include "plan/plan.h"
#include "transport/path.h"

namespace kvblocks {

namespace {
uint8_t *const *Tensors(const CacheEntry &c) { return reinterpret_cast<uint8_t *const *>(c.addrs.data()); }

// `name` is printf-formatted with the list's own index first, e.g. "dst_blocks_list[%zu]".
Status CheckIndexList(const std::string &name, const std::vector<uint64_t> &v, const CacheEntry &c) {
  const size_t i = FirstOutOfRange(v.data(), v.size(), c.num_blocks);
  if (i == v.size()) return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "%s[%zu]=%llu is out of range for cache %lld (%llu blocks)", name.c_str(), i,
              static_cast<unsigned long long>(v[i]), static_cast<long long>(c.id),
              static_cast<unsigned long long>(c.num_blocks));
}
}  // namespace

Status Impl::CopyBlocks(const Cache &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<std::vector<uint64_t>> &dst_lists) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  if (src_blocks.empty() || dst_lists.empty()) return Fail(LLM_PARAM_INVALID, "src_blocks or dst_blocks_list is empty");
  auto s = caches_.Find(src.cache_id);
  auto d = caches_.Find(dst.cache_id);
  if (!s || !d) return Fail(LLM_KV_CACHE_NOT_EXIST, "cache %lld does not exist", (long long)(s ? dst : src).cache_id);
  if (s->kind == CacheKind::kCache || d->kind == CacheKind::kCache)
    return Fail(LLM_PARAM_INVALID, "a cache of batches has no blocks to copy");
  if (s->stride != d->stride || s->num_tensors != d->num_tensors)
    return Fail(LLM_PARAM_INVALID, "the caches differ in block size or tensor count");
  if (s->desc.placement == CachePlacement::kHost && d->desc.placement == CachePlacement::kHost)
    return Fail(LLM_PARAM_INVALID, "host-to-host block copies are not supported (CANN)");
  Status st;
  if ((st = CheckIndexList("src_blocks", src_blocks, *s)) != LLM_SUCCESS) return st;
  for (size_t k = 0; k < dst_lists.size(); ++k) {
    if (dst_lists[k].size() != src_blocks.size())
      return Fail(LLM_PARAM_INVALID, "dst_blocks_list[%zu] has %zu entries, src_blocks %zu", k, dst_lists[k].size(),
                  src_blocks.size());
    if ((st = CheckIndexList("dst_blocks_list[" + std::to_string(k) + "]", dst_lists[k], *d)) != LLM_SUCCESS) return st;
  }
  if (s == d) {
    // Within one cache a block that is both read and written would make the result depend on the
    // copy order: refuse it, as CANN does, before any byte moves.
    std::vector<uint64_t> reads(src_blocks);
    std::sort(reads.begin(), reads.end());
    for (size_t k = 0; k < dst_lists.size(); ++k)
      for (size_t i = 0; i < dst_lists[k].size(); ++i)
        if (std::binary_search(reads.begin(), reads.end(), dst_lists[k][i]))
          return Fail(LLM_PARAM_INVALID,
                      "dst_blocks_list[%zu][%zu]=%llu is also a source block: source and destination blocks "
                      "within one cache must not overlap", k, i, static_cast<unsigned long long>(dst_lists[k][i]));
  }
  CacheUse us(*s);
  std::unique_ptr<CacheUse> ud(d != s ? new CacheUse(*d) : nullptr);
  if (!us.ok || (ud && !ud->ok)) return Fail(LLM_KV_CACHE_NOT_EXIST, "a cache was unregistered during the copy");
  for (const auto &l : dst_lists) {
    Plan plan;
    plan.PairTensors(0, 0, s->num_tensors);
    plan.AddBlocks(src_blocks, l, s->stride);
    CopyPlan(plan, Tensors(*s), Tensors(*d), 0);
  }
  return LLM_SUCCESS;
}

Status Impl::CopyCache(const Cache &src, const Cache &dst, uint32_t src_batch, uint32_t dst_batch, uint64_t offset,
                       int64_t size) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  if (size != -1 && size <= 0) return Fail(LLM_PARAM_INVALID, "size=%lld must be -1 or > 0", (long long)size);
  auto s = caches_.Find(src.cache_id);
  auto d = caches_.Find(dst.cache_id);
  if (!s || !d) return Fail(LLM_KV_CACHE_NOT_EXIST, "cache %lld does not exist", (long long)(s ? dst : src).cache_id);
  if (s->desc.placement == CachePlacement::kHost) return Fail(LLM_PARAM_INVALID, "src_cache is on HOST (CANN)");
  if (s->num_tensors != d->num_tensors) return Fail(LLM_PARAM_INVALID, "the caches differ in tensor count");
  if (src_batch >= s->batch_size || dst_batch >= d->batch_size)
    return Fail(LLM_PARAM_INVALID, "batch index out of range (src %u of %llu, dst %u of %llu)", src_batch,
                (unsigned long long)s->batch_size, dst_batch, (unsigned long long)d->batch_size);
  const uint64_t stride = std::min(s->stride, d->stride);
  if (offset >= stride)
    return Fail(LLM_PARAM_INVALID, "offset=%llu is not inside a %llu-byte row", (unsigned long long)offset,
                (unsigned long long)stride);
  const uint64_t len = size == -1 ? stride - offset : static_cast<uint64_t>(size);
  if (len > stride - offset)
    return Fail(LLM_PARAM_INVALID, "offset + size = %llu exceeds a %llu-byte row", (unsigned long long)(offset + len),
                (unsigned long long)stride);
  CacheUse us(*s);
  std::unique_ptr<CacheUse> ud(d != s ? new CacheUse(*d) : nullptr);
  if (!us.ok || (ud && !ud->ok)) return Fail(LLM_KV_CACHE_NOT_EXIST, "a cache was unregistered during the copy");
  Plan plan;
  plan.PairTensors(0, 0, s->num_tensors);
  plan.AddRange(src_batch * s->stride + offset, dst_batch * d->stride + offset, len);
  // memmove semantics are not needed: CANN forbids overlapping copies within one cache row.
  return CopyPlan(plan, Tensors(*s), Tensors(*d), 0);
}

}  // namespace kvblocks
