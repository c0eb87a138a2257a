// SPDX-License-Identifier: Apache-2.0
// Every precondition of a transfer in CANN's order, one function per kind (engine/checks.h).
#include "engine/checks.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "cache/cache.h"
#include "common/error.h"
#include "common/util.h"
#include "engine/late.h"
#include "engine/layer_push.h"
#include "kvblocks/rules.h"
#include "link/registry.h"
#include "plan/layout.h"
#include "plan/plan.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants and API types

namespace {

Status CheckBlocks(const char *name, const std::vector<uint64_t> &blocks, uint64_t limit, const char *whose,
                   int64_t cache_id) {
  const size_t i = FirstOutOfRange(blocks.data(), blocks.size(), limit);
  if (i == blocks.size()) return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "%s[%zu]=%llu is out of range for %s cache %lld (%llu blocks)", name, i,
              static_cast<unsigned long long>(blocks[i]), whose, static_cast<long long>(cache_id),
              static_cast<unsigned long long>(limit));
}

// With a layout transform the lists tile instead (plan/layout.h checks it).
Status CheckLists(const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst, bool layout = false) {
  if (src.empty()) return Fail(LLM_PARAM_INVALID, "src_blocks is empty");
  if (layout && dst.empty()) return Fail(LLM_PARAM_INVALID, "dst_blocks is empty");
  if (!layout && src.size() != dst.size())
    return Fail(LLM_PARAM_INVALID, "src_blocks has %zu entries, dst_blocks %zu", src.size(), dst.size());
  return LLM_SUCCESS;
}

Status CheckPullRanges(const KvCacheExtParam &ext) {
  if (!LayerRangeValid(ext.src_layer_range.first, ext.src_layer_range.second) ||
      !LayerRangeValid(ext.dst_layer_range.first, ext.dst_layer_range.second))
    return Fail(LLM_PARAM_INVALID, "layer ranges src=(%d, %d) dst=(%d, %d) must be (-1, -1) or first <= second",
                ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                ext.dst_layer_range.second);
  if (ext.tensor_num_per_layer == 0) return Fail(LLM_PARAM_INVALID, "tensor_num_per_layer is 0");
  return LLM_SUCCESS;
}

Status BadSpan(const KvCacheExtParam &ext, uint32_t local_tensors) {
  return Fail(LLM_PARAM_INVALID, "layer ranges src=(%d, %d) dst=(%d, %d) x %u tensors per layer do not fit the %u "
              "tensors of the local cache", ext.src_layer_range.first, ext.src_layer_range.second,
              ext.dst_layer_range.first, ext.dst_layer_range.second, ext.tensor_num_per_layer, local_tensors);
}

Status PullSpan(const KvCacheExtParam &ext, const CacheEntry &lc, bool *explicit_range, TensorSpan *span) {
  if (PullTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                     ext.dst_layer_range.second, ext.tensor_num_per_layer, lc.num_tensors, explicit_range,
                     span) == RuleError::kOk)
    return LLM_SUCCESS;
  return BadSpan(ext, lc.num_tensors);
}

Status CheckPushSource(const Cache &src) {
  if (src.cache_desc.placement == CachePlacement::kDevice) return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "src_cache must be placed on DEVICE to push");
}

Status CheckPushRanges(const KvCacheExtParam &ext, uint32_t desc_tensors) {
  if (PushRangesValid(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                      ext.dst_layer_range.second, desc_tensors) != RuleError::kOk)
    return BadSpan(ext, desc_tensors);
  if (ext.tensor_num_per_layer == 0) return Fail(LLM_PARAM_INVALID, "tensor_num_per_layer is 0");
  return LLM_SUCCESS;
}

Status PushSpan(const KvCacheExtParam &ext, const CacheEntry &lc, const RemoteCache &rc, TensorSpan *span) {
  if (PushTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                     ext.tensor_num_per_layer, lc.num_tensors, rc.num_tensors, span) == RuleError::kOk)
    return LLM_SUCCESS;
  return BadSpan(ext, lc.num_tensors);
}

Status CheckRemoteSpan(const TensorSpan &span, bool explicit_range, const RemoteCache &rc, uint32_t local_tensors) {
  if (explicit_range ? span.src_begin + span.count <= rc.num_tensors : rc.num_tensors == local_tensors)
    return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "remote cache %lld has %u tensors; the transfer needs %s", static_cast<long long>(rc.id),
              rc.num_tensors, explicit_range ? "more" : "as many as the local cache");
}

Status CheckStrides(uint64_t local, const RemoteCache &rc) {
  if (rc.stride == local) return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "block size %llu bytes of remote cache %lld differs from the local %llu",
              static_cast<unsigned long long>(rc.stride), static_cast<long long>(rc.id),
              static_cast<unsigned long long>(local));
}

// The plan of a blocks transfer: equal block sizes, pairs moved whole; or a layout transform.
Status PlanBlocks(Plan *plan, const TensorSpan &span, uint64_t local_stride, const RemoteCache &rc, bool pull,
                  const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst, const LayoutTransform *xf) {
  if (xf == nullptr) {
    const Status st = CheckStrides(local_stride, rc);
    if (st != LLM_SUCCESS) return st;
    plan->PairTensors(span.src_begin, span.dst_begin, span.count);
    plan->AddBlocks(src, dst, local_stride);
    return LLM_SUCCESS;
  }
  const std::string why = CheckLayout(*xf, pull ? rc.stride : local_stride, pull ? local_stride : rc.stride,
                                      src.size(), dst.size());
  if (!why.empty()) return Fail(LLM_PARAM_INVALID, "%s", why.c_str());
  plan->PairTensors(span.src_begin, span.dst_begin, span.count);
  AddLayoutBlocks(*xf, src, dst, plan);
  return LLM_SUCCESS;
}

}  // namespace

// ------------------------------------------------------------------ shared steps
Status Checks::Begin(Transfer *t, bool pull) {
  t->start_ns = NowNs();
  t->state = std::shared_lock<std::shared_mutex>(*v_.state_mu);
  if (!v_.initialized->load(std::memory_order_acquire)) return Fail(LLM_FAILED, "the engine is not initialized");
  t->deadline = t->start_ns + *v_.wait_ms * kMsNs;
  return Role(pull) != LLM_SUCCESS ? LLM_PARAM_INVALID : LLM_SUCCESS;
}

Status Checks::FindLocal(Transfer *t, int64_t cache_id) {
  t->local = v_.caches->Find(cache_id);
  if (t->local) return LLM_SUCCESS;
  return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld does not exist", static_cast<long long>(cache_id));
}

Status Checks::FindLink(Transfer *t, uint64_t cluster_id) {
  t->link = v_.links->FindAlive(cluster_id);
  if (t->link) return LLM_SUCCESS;
  return Fail(LLM_NOT_YET_LINK, "cluster %llu is not linked", static_cast<unsigned long long>(cluster_id));
}

Status Checks::FindRemote(Transfer *t, int64_t cache_id) {
  auto it = t->link->caches.find(cache_id);
  if (__builtin_expect(it != t->link->caches.end(), 1)) {
    t->remote = &it->second;
  } else {
    // Not in the link-time table: registered later (asked once, then kept), or unknown.
    std::shared_ptr<RemoteCache> rc;
    const Status st = v_.late->FindRemote(t->link, cache_id, t->deadline, &rc);
    if (st != LLM_SUCCESS) return st;
    t->remote = rc.get();
    t->remote_hold = std::move(rc);
  }
  t->remote_use.reset(new RemoteUse(*t->remote));
  if (t->remote_use->ok) return LLM_SUCCESS;
  return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu unregistered cache %lld",
              static_cast<unsigned long long>(t->link->remote_cluster_id), static_cast<long long>(cache_id));
}

Status Checks::PullBlocks(Transfer *t, const CacheIndex &src, const Cache &dst,
                          const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                          const KvCacheExtParam &ext, const LayoutTransform *xf) {
  Status st;
  if ((st = Begin(t, true)) != LLM_SUCCESS) return st;
  if (src.batch_index != 0) return Fail(LLM_PARAM_INVALID, "src_index.batch_index must be 0 for blocks");
  if ((st = CheckPullRanges(ext)) != LLM_SUCCESS || (st = CheckLists(src_blocks, dst_blocks, xf != nullptr)) != LLM_SUCCESS)
    return st;
  if (src.cluster_id == v_.cluster_id) return Fail(LLM_PARAM_INVALID, "src_index.cluster_id is this engine's own");
  bool explicit_range;
  TensorSpan span;
  if ((st = PullIntoBlocks(t, src, dst, dst_blocks, ext, &explicit_range, &span)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t->local;
  const RemoteCache &rc = *t->remote;
  if (rc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "remote cache %lld holds batches, not blocks", (long long)rc.id);
  if ((st = CheckRemoteSpan(span, explicit_range, rc, lc.num_tensors)) != LLM_SUCCESS) return st;
  if ((st = CheckBlocks("src_blocks", src_blocks, rc.num_blocks, "remote", rc.id)) != LLM_SUCCESS) return st;
  return PlanBlocks(&t->plan, span, lc.stride, rc, true, src_blocks, dst_blocks, xf);
}

Status Checks::PushBlocks(Transfer *t, const Cache &src, const CacheIndex &dst,
                          const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                          const KvCacheExtParam &ext, const LayoutTransform *xf) {
  Status st;
  if ((st = Begin(t, false)) != LLM_SUCCESS) return st;
  if ((st = CheckPushSource(src)) != LLM_SUCCESS) return st;
  if ((st = CheckLists(src_blocks, dst_blocks, xf != nullptr)) != LLM_SUCCESS) return st;
  if (dst.batch_index != 0) return Fail(LLM_PARAM_INVALID, "dst_index.batch_index must be 0 for blocks");
  if ((st = CheckPushRanges(ext, src.cache_desc.num_tensors)) != LLM_SUCCESS) return st;
  if ((st = FindLocal(t, src.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t->local;
  if ((st = FindLink(t, dst.cluster_id)) != LLM_SUCCESS || (st = FindRemote(t, dst.cache_id)) != LLM_SUCCESS) return st;
  const RemoteCache &rc = *t->remote;
  if (rc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "remote cache %lld holds batches, not blocks", (long long)rc.id);
  TensorSpan span;
  if ((st = PushSpan(ext, lc, rc, &span)) != LLM_SUCCESS) return st;
  if ((st = CheckBlocks("dst_blocks", dst_blocks, rc.num_blocks, "remote", rc.id)) != LLM_SUCCESS) return st;
  if (lc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "local cache %lld holds batches, not blocks", (long long)lc.id);
  if ((st = CheckBlocks("src_blocks", src_blocks, lc.num_blocks, "local", lc.id)) != LLM_SUCCESS) return st;
  return PlanBlocks(&t->plan, span, lc.stride, rc, false, src_blocks, dst_blocks, xf);
}

Status Checks::PullCache(Transfer *t, const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                         const KvCacheExtParam &ext) {
  Status st;
  if ((st = Begin(t, true)) != LLM_SUCCESS) return st;
  if (size != -1 && size <= 0) return Fail(LLM_PARAM_INVALID, "size=%lld must be -1 or > 0", (long long)size);
  if ((st = CheckPullRanges(ext)) != LLM_SUCCESS) return st;
  if (src.cluster_id == v_.cluster_id) return Fail(LLM_PARAM_INVALID, "src_index.cluster_id is this engine's own");
  if ((st = FindLocal(t, dst.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t->local;
  if (batch_index >= lc.batch_size)
    return Fail(LLM_PARAM_INVALID, "batch_index=%u is out of range for local cache %lld (%llu batches)", batch_index,
                (long long)lc.id, (unsigned long long)lc.batch_size);
  if (size > 0 && static_cast<uint64_t>(size) > lc.stride)
    return Fail(LLM_PARAM_INVALID, "size=%lld exceeds the %llu bytes of a local batch row", (long long)size,
                (unsigned long long)lc.stride);
  bool explicit_range;
  TensorSpan span;
  if ((st = PullSpan(ext, lc, &explicit_range, &span)) != LLM_SUCCESS) return st;
  if ((st = FindLink(t, src.cluster_id)) != LLM_SUCCESS || (st = FindRemote(t, src.cache_id)) != LLM_SUCCESS)
    return st;
  const RemoteCache &rc = *t->remote;
  if ((st = CheckRemoteSpan(span, explicit_range, rc, lc.num_tensors)) != LLM_SUCCESS) return st;
  if (src.batch_index >= rc.batch_size)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "src_index.batch_index=%u is out of range for remote cache %lld (%llu batches)",
                src.batch_index, (long long)rc.id, (unsigned long long)rc.batch_size);
  const uint64_t len = size == -1 ? lc.stride : static_cast<uint64_t>(size);
  if (len > rc.stride)
    return Fail(LLM_PARAM_INVALID, "%llu bytes exceed the %llu bytes of a remote batch row", (unsigned long long)len,
                (unsigned long long)rc.stride);
  t->plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  t->plan.AddRange(src.batch_index * rc.stride, batch_index * lc.stride, len);
  return LLM_SUCCESS;
}

Status Checks::PushCache(Transfer *t, const Cache &src, const CacheIndex &dst, uint32_t src_batch_index,
                         int64_t size, const KvCacheExtParam &ext) {
  Status st;
  if ((st = Begin(t, false)) != LLM_SUCCESS) return st;
  if ((st = CheckPushSource(src)) != LLM_SUCCESS) return st;
  if (size != -1) return Fail(LLM_PARAM_INVALID, "size=%lld: push_kv_cache supports only -1", (long long)size);
  if ((st = CheckPushRanges(ext, src.cache_desc.num_tensors)) != LLM_SUCCESS) return st;
  if ((st = FindLocal(t, src.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t->local;
  if ((st = FindLink(t, dst.cluster_id)) != LLM_SUCCESS || (st = FindRemote(t, dst.cache_id)) != LLM_SUCCESS) return st;
  const RemoteCache &rc = *t->remote;
  if (dst.batch_index >= rc.batch_size)
    return Fail(LLM_PARAM_INVALID, "dst_index.batch_index=%u is out of range for remote cache %lld (%llu batches)",
                dst.batch_index, (long long)rc.id, (unsigned long long)rc.batch_size);
  TensorSpan span;
  if ((st = PushSpan(ext, lc, rc, &span)) != LLM_SUCCESS) return st;
  if (src_batch_index >= lc.batch_size)
    return Fail(LLM_PARAM_INVALID, "src_batch_index=%u is out of range for local cache %lld (%llu batches)",
                src_batch_index, (long long)lc.id, (unsigned long long)lc.batch_size);
  if (lc.stride > rc.stride)
    return Fail(LLM_PARAM_INVALID, "a local batch row (%llu bytes) exceeds a remote one (%llu bytes)",
                (unsigned long long)lc.stride, (unsigned long long)rc.stride);
  t->plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  t->plan.AddRange(src_batch_index * lc.stride, dst.batch_index * rc.stride, lc.stride);
  return LLM_SUCCESS;
}

// Every check of PushKvBlocks over all layers; then one plan per layer (its tensors, every block).
Status Checks::LayerBlocks(Transfer *t, const Cache &src, const CacheIndex &dst,
                           const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                           uint8_t tnpl, std::vector<Plan> *layers) {
  KvCacheExtParam ext;  // (-1, -1): every layer
  ext.tensor_num_per_layer = tnpl;
  const Status st = PushBlocks(t, src, dst, src_blocks, dst_blocks, ext);
  if (st != LLM_SUCCESS) return st;
  const Plan &all = t->plan;
  const size_t n = all.src_tensors.size() / tnpl;  // PushTensorSpan checked that tnpl divides
  layers->resize(n);
  for (size_t l = 0; l < n; ++l) {
    Plan &p = (*layers)[l];
    p.src_tensors.assign(all.src_tensors.begin() + l * tnpl, all.src_tensors.begin() + (l + 1) * tnpl);
    p.dst_tensors.assign(all.dst_tensors.begin() + l * tnpl, all.dst_tensors.begin() + (l + 1) * tnpl);
    p.segs = all.segs;
    p.bytes_per_tensor = all.bytes_per_tensor;
  }
  return LLM_SUCCESS;
}

// The engine-wide checks of a push (state, role, placement, local cache, link) for a piece push.
Status Checks::LayerBase(Transfer *t, const Cache &src, uint64_t dst_cluster_id) {
  Status st;
  if ((st = Begin(t, false)) != LLM_SUCCESS) return st;
  if ((st = CheckPushSource(src)) != LLM_SUCCESS) return st;
  if ((st = FindLocal(t, src.cache_id)) != LLM_SUCCESS) return st;
  return FindLink(t, dst_cluster_id);
}

// The remote tensor a piece writes to, and its byte offset there: by cache id, or by an address
// the peer announced in its cache table. Both are checked against that table.
Status Checks::ResolvePiece(const Transfer &base, const LayerPiece &pc, int64_t *cache_id, uint32_t *tensor,
                            uint64_t *base_off) {
  const auto &caches = base.link->caches;
  if (pc.dst_cache_id > 0) {
    std::shared_ptr<RemoteCache> rc;
    const Status st = v_.late->FindRemote(base.link, pc.dst_cache_id, base.deadline, &rc);  // link-time ones too
    if (st != LLM_SUCCESS) return st;
    if (pc.dst_tensor >= rc->num_tensors)
      return Fail(LLM_PARAM_INVALID, "remote cache %lld has %u tensors; tensor %u was asked for",
                  (long long)pc.dst_cache_id, rc->num_tensors, pc.dst_tensor);
    *cache_id = pc.dst_cache_id;
    *tensor = pc.dst_tensor;
    *base_off = 0;
    return LLM_SUCCESS;
  }
  for (const auto &kv : caches) {
    const RemoteCache &rc = kv.second;
    for (uint32_t k = 0; k < rc.addrs.size(); ++k)
      if (pc.dst_addr >= rc.addrs[k] && pc.dst_addr - rc.addrs[k] < rc.tensor_bytes) {
        *cache_id = kv.first;
        *tensor = k;
        *base_off = pc.dst_addr - rc.addrs[k];
        return LLM_SUCCESS;
      }
  }
  return Fail(LLM_PARAM_INVALID, "dst address 0x%llx is in no tensor cluster %llu registered",
              (unsigned long long)pc.dst_addr, (unsigned long long)base.link->remote_cluster_id);
}

// Checks one piece against both tables and adds it to the transfer of its remote cache.
Status Checks::AddLayerPiece(Transfer *base, const LayerPiece &pc, std::vector<TransferPtr> *ts,
                             std::vector<std::vector<LayerItem>> *layers) {
  const CacheEntry &lc = *base->local;
  if (pc.src_tensor >= lc.num_tensors)
    return Fail(LLM_PARAM_INVALID, "src tensor %u is out of range for local cache %lld (%u tensors)", pc.src_tensor,
                (long long)lc.id, lc.num_tensors);
  if (pc.layer >= layers->size()) return Fail(LLM_PARAM_INVALID, "piece of layer %u of %zu", pc.layer, layers->size());
  int64_t cid;
  uint32_t tensor;
  uint64_t off;
  Status st;
  if ((st = ResolvePiece(*base, pc, &cid, &tensor, &off)) != LLM_SUCCESS) return st;
  size_t ti = 0;
  while (ti < ts->size() && (*ts)[ti]->remote->id != cid) ++ti;
  if (ti == ts->size()) {
    TransferPtr t = TransferPtr(new Transfer);
    t->deadline = base->deadline;
    t->local = base->local;
    t->link = base->link;
    if ((st = FindRemote(t.get(), cid)) != LLM_SUCCESS) return st;
    t->remote_use.reset();
    ts->push_back(std::move(t));
  }
  const RemoteCache &rc = *(*ts)[ti]->remote;
  Plan plan;
  plan.PairTensors(pc.src_tensor, tensor, 1);
  for (const LayerSegment &s : pc.segs) {
    if (s.len == 0 || s.src_off > lc.tensor_bytes || s.len > lc.tensor_bytes - s.src_off)
      return Fail(LLM_PARAM_INVALID, "bytes [%llu, +%llu) are outside local tensor %u (%llu bytes)",
                  (unsigned long long)s.src_off, (unsigned long long)s.len, pc.src_tensor,
                  (unsigned long long)lc.tensor_bytes);
    const uint64_t d = off + s.dst_off;
    if (d < off || d > rc.tensor_bytes || s.len > rc.tensor_bytes - d)
      return Fail(LLM_PARAM_INVALID, "bytes [%llu, +%llu) are outside tensor %u of remote cache %lld (%llu bytes)",
                  (unsigned long long)d, (unsigned long long)s.len, tensor, (long long)rc.id,
                  (unsigned long long)rc.tensor_bytes);
    plan.AddRange(s.src_off, d, s.len);
  }
  if (plan.segs.empty()) return Fail(LLM_PARAM_INVALID, "a piece of layer %u has no bytes", pc.layer);
  (*layers)[pc.layer].push_back(LayerItem{ti, std::move(plan)});
  return LLM_SUCCESS;
}

// Row src.batch_index of a contiguous remote cache, cut into local blocks: chunk j -> dst_blocks[j].
// The local half of a pull into blocks, in CANN's order: local cache, layer math, link, local
// bounds; then the remote cache (the caller checks its kind and bounds).
Status Checks::PullIntoBlocks(Transfer *t, const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &dst_blocks,
                              const KvCacheExtParam &ext, bool *explicit_range, TensorSpan *span) {
  Status st;
  if ((st = FindLocal(t, dst.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t->local;
  if (lc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "local cache %lld holds batches, not blocks", (long long)lc.id);
  if ((st = PullSpan(ext, lc, explicit_range, span)) != LLM_SUCCESS) return st;
  if ((st = FindLink(t, src.cluster_id)) != LLM_SUCCESS) return st;
  if ((st = CheckBlocks("dst_blocks", dst_blocks, lc.num_blocks, "local", lc.id)) != LLM_SUCCESS) return st;
  return FindRemote(t, src.cache_id);
}

Status Checks::PullRowToBlocks(Transfer *t, const CacheIndex &src, const Cache &dst,
                               const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Status st;
  if ((st = Begin(t, true)) != LLM_SUCCESS) return st;
  if ((st = CheckPullRanges(ext)) != LLM_SUCCESS) return st;
  if (dst_blocks.empty()) return Fail(LLM_PARAM_INVALID, "dst_blocks is empty");
  if (src.cluster_id == v_.cluster_id) return Fail(LLM_PARAM_INVALID, "src_index.cluster_id is this engine's own");
  bool explicit_range;
  TensorSpan span;
  if ((st = PullIntoBlocks(t, src, dst, dst_blocks, ext, &explicit_range, &span)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t->local;
  const RemoteCache &rc = *t->remote;
  if (rc.kind == CacheKind::kBlocks) return Fail(LLM_PARAM_INVALID, "remote cache %lld holds blocks, not batches", (long long)rc.id);
  if ((st = CheckRemoteSpan(span, explicit_range, rc, lc.num_tensors)) != LLM_SUCCESS) return st;
  if (src.batch_index >= rc.batch_size)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "src_index.batch_index=%u is out of range for remote cache %lld (%llu batches)",
                src.batch_index, (long long)rc.id, (unsigned long long)rc.batch_size);
  const uint64_t chunks = (rc.stride + lc.stride - 1) / lc.stride;
  if (dst_blocks.size() > chunks)
    return Fail(LLM_PARAM_INVALID, "%zu dst_blocks for a %llu-byte remote row of %llu local blocks", dst_blocks.size(),
                (unsigned long long)rc.stride, (unsigned long long)chunks);
  t->plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  for (size_t j = 0; j < dst_blocks.size(); ++j) {
    const uint64_t off = j * lc.stride;
    t->plan.AddRange(src.batch_index * rc.stride + off, dst_blocks[j] * lc.stride, std::min(lc.stride, rc.stride - off));
  }
  return LLM_SUCCESS;
}

Status Checks::Blocks(Transfer *t, bool pull, const CacheIndex &remote, const Cache &local,
                      const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst, const KvCacheExtParam &ext,
                      const LayoutTransform *xf) {
  return pull ? PullBlocks(t, remote, local, src, dst, ext, xf) : PushBlocks(t, local, remote, src, dst, ext, xf);
}

namespace {
const char *RoleName(LlmRole r) {
  switch (r) {
    case LlmRole::kPrompt:
      return "PROMPT";
    case LlmRole::kDecoder:
      return "DECODER";
    case LlmRole::kMix:
      return "MIX";
    default:
      return "unknown";
  }
}
}  // namespace

Status Checks::Role(bool pull) const {
  if (!*v_.role_check) return LLM_SUCCESS;
  const LlmRole r = v_.role->load();
  if (r == LlmRole::kMix) return LLM_SUCCESS;
  if (pull ? r == LlmRole::kDecoder : r == LlmRole::kPrompt) return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "role %s cannot %s (needs %s or MIX; or set %s=0)", RoleName(r),
              pull ? "pull" : "push", pull ? "DECODER" : "PROMPT", OPTION_ROLE_CHECK);
}

}  // namespace kvblocks
