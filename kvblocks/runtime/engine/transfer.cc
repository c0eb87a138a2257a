// SPDX-License-Identifier: Apache-2.0
// Pull/Push of blocks and batches: argument checks in CANN's order, then one plan executed on the
// remote cache's path. Every check runs before the first byte moves, so a failed call changes no
// memory.
#include <algorithm>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "kvblocks/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "engine/late.h"
#include "engine/transfer.h"
#include "engine/layer_push.h"
#include "plan/layout.h"
#include "plan/plan.h"

namespace kvblocks {


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
Status Impl::Begin(Transfer *t, bool pull) {
  t->start_ns = NowNs();
  t->state = std::shared_lock<std::shared_mutex>(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  t->deadline = t->start_ns + wait_time_ms_ * kMsNs;
  return CheckRole(pull) != LLM_SUCCESS ? LLM_PARAM_INVALID : LLM_SUCCESS;
}

Status Impl::FindLocal(Transfer *t, int64_t cache_id) {
  t->local = caches_.Find(cache_id);
  if (t->local) return LLM_SUCCESS;
  return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld does not exist", static_cast<long long>(cache_id));
}

Status Impl::FindLink(Transfer *t, uint64_t cluster_id) {
  t->link = links_.FindAlive(cluster_id);
  if (t->link) return LLM_SUCCESS;
  return Fail(LLM_NOT_YET_LINK, "cluster %llu is not linked", static_cast<unsigned long long>(cluster_id));
}

Status Impl::FindRemote(Transfer *t, int64_t cache_id) {
  auto it = t->link->caches.find(cache_id);
  if (__builtin_expect(it != t->link->caches.end(), 1)) {
    t->remote = &it->second;
  } else {
    // Not in the link-time table: registered later (asked once, then kept), or unknown.
    std::shared_ptr<RemoteCache> rc;
    const Status st = late_->FindRemote(t->link, cache_id, t->deadline, &rc);
    if (st != LLM_SUCCESS) return st;
    t->remote = rc.get();
    t->remote_hold = std::move(rc);
  }
  t->remote_use.reset(new RemoteUse(*t->remote));
  if (t->remote_use->ok) return LLM_SUCCESS;
  return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu unregistered cache %lld",
              static_cast<unsigned long long>(t->link->remote_cluster_id), static_cast<long long>(cache_id));
}

Status Impl::Execute(Transfer *t, bool pull) {
  Status st = ExecuteOne(t, pull);
  for (size_t i = 0; st == LLM_SUCCESS && i < t->rest.size(); ++i) {
    Transfer *p = t->rest[i].get();
    p->remote_use.reset(new RemoteUse(*p->remote));
    if (!p->remote_use->ok)
      return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu unregistered cache %lld",
                  static_cast<unsigned long long>(p->link->remote_cluster_id), static_cast<long long>(p->remote->id));
    st = ExecuteOne(p, pull);
    p->remote_use.reset();
  }
  return st;
}

Status Impl::ExecuteOne(Transfer *t, bool pull) {
  CacheUse use(*t->local);
  if (!use.ok) return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld was unregistered", static_cast<long long>(t->local->id));
  metrics::Busy busy(t->link->stats->Path(t->remote->path->name()));
  return Conclude(t, pull, t->remote->path->Execute(t->plan, *t->local, pull, t->deadline));
}

Status Impl::Conclude(Transfer *t, bool pull, Status st) {
  // A timed-out or broken transfer leaves the link unusable, as in CANN: re-link to recover.
  if (st == LLM_TIMEOUT || st == LLM_LINK_FAILED) t->link->Fail();
  if (st == LLM_TIMEOUT) {
    // The deadline and its option first, whatever the socket said (it only saw "no answer in time").
    const std::string below = LastErrorMessage();
    return Restate(st, "%s cluster %llu did not complete within llm.SyncKvCacheWaitTime=%lld ms%s%s%s; the link is "
                   "now broken", pull ? "pull from" : "push to", static_cast<unsigned long long>(t->link->remote_cluster_id),
                   static_cast<long long>(wait_time_ms_), below.empty() ? "" : " (", below.c_str(), below.empty() ? "" : ")");
  }
  if (st == LLM_LINK_FAILED)
    return Fail(st, "the link to cluster %llu failed", static_cast<unsigned long long>(t->link->remote_cluster_id));
  return st;
}

// ------------------------------------------------------------------ blocks
Status Impl::PullBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Transfer t;
  const Status st = PreparePullBlocks(t, src, dst, src_blocks, dst_blocks, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, true));
}

Status Impl::PreparePullBlocks(Transfer &t, const CacheIndex &src, const Cache &dst,
                               const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                               const KvCacheExtParam &ext, const LayoutTransform *xf) {
  Status st;
  if ((st = Begin(&t, true)) != LLM_SUCCESS) return st;
  if (src.batch_index != 0) return Fail(LLM_PARAM_INVALID, "src_index.batch_index must be 0 for blocks");
  if ((st = CheckPullRanges(ext)) != LLM_SUCCESS || (st = CheckLists(src_blocks, dst_blocks, xf != nullptr)) != LLM_SUCCESS)
    return st;
  if (src.cluster_id == cluster_id_) return Fail(LLM_PARAM_INVALID, "src_index.cluster_id is this engine's own");
  bool explicit_range;
  TensorSpan span;
  if ((st = PullIntoBlocks(&t, src, dst, dst_blocks, ext, &explicit_range, &span)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t.local;
  const RemoteCache &rc = *t.remote;
  if (rc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "remote cache %lld holds batches, not blocks", (long long)rc.id);
  if ((st = CheckRemoteSpan(span, explicit_range, rc, lc.num_tensors)) != LLM_SUCCESS) return st;
  if ((st = CheckBlocks("src_blocks", src_blocks, rc.num_blocks, "remote", rc.id)) != LLM_SUCCESS) return st;
  return PlanBlocks(&t.plan, span, lc.stride, rc, true, src_blocks, dst_blocks, xf);
}

Status Impl::PushBlocks(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPushBlocks;
  const Status st = PreparePushBlocks(t, src, dst, src_blocks, dst_blocks, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, false));
}

Status Impl::PreparePushBlocks(Transfer &t, const Cache &src, const CacheIndex &dst,
                               const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                               const KvCacheExtParam &ext, const LayoutTransform *xf) {
  Status st;
  if ((st = Begin(&t, false)) != LLM_SUCCESS) return st;
  if ((st = CheckPushSource(src)) != LLM_SUCCESS) return st;
  if ((st = CheckLists(src_blocks, dst_blocks, xf != nullptr)) != LLM_SUCCESS) return st;
  if (dst.batch_index != 0) return Fail(LLM_PARAM_INVALID, "dst_index.batch_index must be 0 for blocks");
  if ((st = CheckPushRanges(ext, src.cache_desc.num_tensors)) != LLM_SUCCESS) return st;
  if ((st = FindLocal(&t, src.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t.local;
  if ((st = FindLink(&t, dst.cluster_id)) != LLM_SUCCESS || (st = FindRemote(&t, dst.cache_id)) != LLM_SUCCESS) return st;
  const RemoteCache &rc = *t.remote;
  if (rc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "remote cache %lld holds batches, not blocks", (long long)rc.id);
  TensorSpan span;
  if ((st = PushSpan(ext, lc, rc, &span)) != LLM_SUCCESS) return st;
  if ((st = CheckBlocks("dst_blocks", dst_blocks, rc.num_blocks, "remote", rc.id)) != LLM_SUCCESS) return st;
  if (lc.kind == CacheKind::kCache) return Fail(LLM_PARAM_INVALID, "local cache %lld holds batches, not blocks", (long long)lc.id);
  if ((st = CheckBlocks("src_blocks", src_blocks, lc.num_blocks, "local", lc.id)) != LLM_SUCCESS) return st;
  return PlanBlocks(&t.plan, span, lc.stride, rc, false, src_blocks, dst_blocks, xf);
}

// ------------------------------------------------------------------ batches
Status Impl::PullCache(const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPullCache;
  return Tally(&t, PullCacheOn(t, src, dst, batch_index, size, ext));
}

Status Impl::PushCache(const Cache &src, const CacheIndex &dst, uint32_t src_batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPushCache;
  return Tally(&t, PushCacheOn(t, src, dst, src_batch_index, size, ext));
}

Status Impl::PullCacheOn(Transfer &t, const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                         const KvCacheExtParam &ext) {
  Status st;
  if ((st = Begin(&t, true)) != LLM_SUCCESS) return st;
  if (size != -1 && size <= 0) return Fail(LLM_PARAM_INVALID, "size=%lld must be -1 or > 0", (long long)size);
  if ((st = CheckPullRanges(ext)) != LLM_SUCCESS) return st;
  if (src.cluster_id == cluster_id_) return Fail(LLM_PARAM_INVALID, "src_index.cluster_id is this engine's own");
  if ((st = FindLocal(&t, dst.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t.local;
  if (batch_index >= lc.batch_size)
    return Fail(LLM_PARAM_INVALID, "batch_index=%u is out of range for local cache %lld (%llu batches)", batch_index,
                (long long)lc.id, (unsigned long long)lc.batch_size);
  if (size > 0 && static_cast<uint64_t>(size) > lc.stride)
    return Fail(LLM_PARAM_INVALID, "size=%lld exceeds the %llu bytes of a local batch row", (long long)size,
                (unsigned long long)lc.stride);
  bool explicit_range;
  TensorSpan span;
  if ((st = PullSpan(ext, lc, &explicit_range, &span)) != LLM_SUCCESS) return st;
  if ((st = FindLink(&t, src.cluster_id)) != LLM_SUCCESS || (st = FindRemote(&t, src.cache_id)) != LLM_SUCCESS)
    return st;
  const RemoteCache &rc = *t.remote;
  if ((st = CheckRemoteSpan(span, explicit_range, rc, lc.num_tensors)) != LLM_SUCCESS) return st;
  if (src.batch_index >= rc.batch_size)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "src_index.batch_index=%u is out of range for remote cache %lld (%llu batches)",
                src.batch_index, (long long)rc.id, (unsigned long long)rc.batch_size);
  const uint64_t len = size == -1 ? lc.stride : static_cast<uint64_t>(size);
  if (len > rc.stride)
    return Fail(LLM_PARAM_INVALID, "%llu bytes exceed the %llu bytes of a remote batch row", (unsigned long long)len,
                (unsigned long long)rc.stride);
  t.plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  t.plan.AddRange(src.batch_index * rc.stride, batch_index * lc.stride, len);
  return Execute(&t, true);
}

Status Impl::PushCacheOn(Transfer &t, const Cache &src, const CacheIndex &dst, uint32_t src_batch_index,
                         int64_t size, const KvCacheExtParam &ext) {
  Status st;
  if ((st = Begin(&t, false)) != LLM_SUCCESS) return st;
  if ((st = CheckPushSource(src)) != LLM_SUCCESS) return st;
  if (size != -1) return Fail(LLM_PARAM_INVALID, "size=%lld: push_kv_cache supports only -1", (long long)size);
  if ((st = CheckPushRanges(ext, src.cache_desc.num_tensors)) != LLM_SUCCESS) return st;
  if ((st = FindLocal(&t, src.cache_id)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t.local;
  if ((st = FindLink(&t, dst.cluster_id)) != LLM_SUCCESS || (st = FindRemote(&t, dst.cache_id)) != LLM_SUCCESS) return st;
  const RemoteCache &rc = *t.remote;
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
  t.plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  t.plan.AddRange(src_batch_index * lc.stride, dst.batch_index * rc.stride, lc.stride);
  return Execute(&t, false);
}

// ------------------------------------------------------------------ asynchronous (engine/async.cc)
void TransferFree::operator()(Transfer *t) const { delete t; }

TransferPtr Impl::NewTransfer() { return TransferPtr(new Transfer); }

Status Impl::PrepareBlocks(Transfer *t, const BlocksRequest &r) {
  return PrepareBlocks(t, r.pull, r.remote, r.local, r.src_blocks, r.dst_blocks, r.ext);
}

Status Impl::PrepareBlocks(Transfer *t, bool pull, const CacheIndex &remote, const Cache &local,
                           const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst,
                           const KvCacheExtParam &ext) {
  return pull ? PreparePullBlocks(*t, remote, local, src, dst, ext) : PreparePushBlocks(*t, local, remote, src, dst, ext);
}

// A prepared transfer leaves the submitting thread without its locks: a lock is released by the
// thread that took it. What it keeps (the cache entry, the link, the remote cache) are references.
void Impl::Detach(Transfer *t) {
  t->remote_use.reset();
  t->state.unlock();
}

// On the worker: take again what Execute needs, and re-check what may have changed since the
// submission. A transfer still queued at its deadline fails with LLM_TIMEOUT but moved nothing,
// so it leaves the link intact.
Status Impl::ExecuteDetached(Transfer *t, bool pull) {
  const Status st = ResumeDetached(t, pull);
  return st != LLM_SUCCESS ? st : ConcludeDetached(t, pull, Execute(t, pull));
}

Status Impl::ResumeDetached(Transfer *t, bool pull) {
  t->state = std::shared_lock<std::shared_mutex>(state_mu_);
  const char *what = pull ? "pull" : "push";
  const unsigned long long peer = t->link->remote_cluster_id;
  if (!initialized()) return Fail(LLM_FAILED, "the engine was finalized before the %s started", what);
  if (NowNs() >= t->deadline)
    return Fail(LLM_TIMEOUT, "%s did not start within llm.SyncKvCacheWaitTime=%lld ms of its submission; nothing "
                "moved", what, static_cast<long long>(wait_time_ms_));
  if (!t->link->alive.load()) return Fail(LLM_LINK_FAILED, "the link to cluster %llu failed before the %s started", peer, what);
  t->remote_use.reset(new RemoteUse(*t->remote));
  if (!t->remote_use->ok)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu unregistered cache %lld", peer, static_cast<long long>(t->remote->id));
  return LLM_SUCCESS;
}

Status Impl::ConcludeDetached(Transfer *t, bool pull, Status st) {
  const char *what = pull ? "pull" : "push";
  const unsigned long long peer = t->link->remote_cluster_id;
  if (st == LLM_NOT_YET_LINK || st == LLM_LINK_FAILED)  // no-op when the path gave a reason
    Fail(st, "the link to cluster %llu broke while the %s was in flight (a transfer on it timed out or failed)",
         peer, what);
  return st;
}

// ------------------------------------------------------------------ layer-wise (engine/layerwise.cc)
// Every check of PushKvBlocks over all layers; then one plan per layer (its tensors, every block).
Status Impl::PrepareLayerBlocks(Transfer *t, const Cache &src, const CacheIndex &dst,
                                const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                uint8_t tnpl, std::vector<Plan> *layers) {
  KvCacheExtParam ext;  // (-1, -1): every layer
  ext.tensor_num_per_layer = tnpl;
  const Status st = PreparePushBlocks(*t, src, dst, src_blocks, dst_blocks, ext);
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
Status Impl::PrepareLayerBase(Transfer *t, const Cache &src, uint64_t dst_cluster_id) {
  Status st;
  if ((st = Begin(t, false)) != LLM_SUCCESS) return st;
  if ((st = CheckPushSource(src)) != LLM_SUCCESS) return st;
  if ((st = FindLocal(t, src.cache_id)) != LLM_SUCCESS) return st;
  return FindLink(t, dst_cluster_id);
}

// The remote tensor a piece writes to, and its byte offset there: by cache id, or by an address
// the peer announced in its cache table. Both are checked against that table.
Status Impl::ResolvePiece(const Transfer &base, const LayerPiece &pc, int64_t *cache_id, uint32_t *tensor,
                          uint64_t *base_off) {
  const auto &caches = base.link->caches;
  if (pc.dst_cache_id > 0) {
    std::shared_ptr<RemoteCache> rc;
    const Status st = late_->FindRemote(base.link, pc.dst_cache_id, base.deadline, &rc);  // link-time ones too
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
Status Impl::AddLayerPiece(Transfer *base, const LayerPiece &pc, std::vector<TransferPtr> *ts,
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
    TransferPtr t = NewTransfer();
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

// One layer's plan on a detached transfer: takes the locks, runs it, lets them go again.
// The plan is swapped in and out, so a layer costs no allocation.
Status Impl::ExecuteLayer(Transfer *t, Plan *plan, int64_t deadline) {
  std::swap(t->plan, *plan);
  t->deadline = deadline;
  t->start_ns = NowNs();
  t->kind = metrics::kPushLayerwise;
  const Status st = Tally(t, ExecuteDetached(t, false));
  Detach(t);
  std::swap(t->plan, *plan);
  return st;
}

int64_t Impl::TransferDeadline(const Transfer *t) { return t->deadline; }
// A pipelined run (engine/async.cc) shares one channel between the transfers of one key.
const void *Impl::PipelineKey(const Transfer *t, bool pull) { return t->remote->path->PipelineKey(t->plan, pull); }

std::shared_ptr<void> Impl::LinkOf(const Transfer *t) { return t->link; }

namespace {
bool OneSided(const Transfer *t) { return t->remote->path->mode() == PathMode::kLocalCopy; }
}  // namespace

// A one-sided copy small enough that the worker running it is soon free again.
bool Impl::BriefCopy(const Transfer *t) { return OneSided(t) && t->plan.total_bytes() <= kBriefCopyBytes; }

// A one-sided copy small enough to run on the submitting thread.
bool Impl::InlineCopy(const Transfer *t) { return OneSided(t) && t->plan.total_bytes() <= kInlineCopyBytes; }

// On the worker, for a transfer joining a pipelined run: what ExecuteDetached checks and Execute
// holds, kept in the transfer until FinishPiped.
Status Impl::StartPiped(Transfer *t, bool pull, PipeItem *item) {
  Status st = ResumeDetached(t, pull);
  if (st != LLM_SUCCESS) return st;
  t->local_use.reset(new CacheUse(*t->local));
  if (!t->local_use->ok)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld was unregistered", static_cast<long long>(t->local->id));
  item->plan = &t->plan;
  item->local = t->local.get();
  item->path = t->remote->path.get();
  item->pull = pull;
  item->deadline = t->deadline;
  metrics::Busy::Enter(t->link->stats->Path(item->path->name()));
  return LLM_SUCCESS;
}

Status Impl::FinishPiped(Transfer *t, bool pull, Status st) {
  metrics::Busy::Leave(t->link->stats->Path(t->remote->path->name()));
  return ConcludeDetached(t, pull, Conclude(t, pull, st));
}

// ------------------------------------------------------------------ extensions
// By key: the link-time table, then caches learned since (engine/late.cc), then the peer is asked
// once (CACHE_QUERY by key). Not found is not remembered: a key bound later is found then.
Status Impl::FindRemoteCache(uint64_t cluster_id, int64_t key, int64_t *cache_id) {
  Transfer t;
  Status st;
  if ((st = FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
  for (const auto &kv : t.link->caches)
    if (kv.second.key == key) {
      *cache_id = kv.first;
      return LLM_SUCCESS;
    }
  {
    std::shared_lock<std::shared_mutex> g(t.link->late_mu);
    for (const auto &kv : t.link->late)
      if (key >= 0 && kv.second->key == key) {
        *cache_id = kv.first;
        return LLM_SUCCESS;
      }
  }
  std::shared_ptr<RemoteCache> rc;
  if ((st = late_->FindKey(t.link, kQueryByCacheKey, key, NowNs() + wait_time_ms_ * kMsNs, &rc)) != LLM_SUCCESS)
    return st;
  *cache_id = rc->id;
  return LLM_SUCCESS;
}

Status Impl::DescribeRemoteCache(uint64_t cluster_id, int64_t cache_id, RemoteCacheInfo *out) {
  Transfer t;
  Status st;
  if ((st = FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
  std::shared_ptr<RemoteCache> found;
  if ((st = late_->FindRemote(t.link, cache_id, NowNs() + wait_time_ms_ * kMsNs, &found)) != LLM_SUCCESS) return st;
  const RemoteCache &rc = *found;
  out->cache_id = rc.id;
  out->key = rc.key;
  out->num_tensors = rc.num_tensors;
  out->tensor_bytes = rc.tensor_bytes;
  out->num_blocks = rc.num_blocks;
  out->batch_size = rc.batch_size;
  out->stride = rc.stride;
  out->addrs = rc.addrs;
  out->allocated = rc.has_memfd;
  out->batch_keys = rc.batch_keys;
  std::shared_lock<std::shared_mutex> g(rc.live->mu);
  for (auto &k : out->batch_keys)
    if (rc.live->released_keys.count(k) != 0) k = -1;  // released since linking (keys.cc)
  return LLM_SUCCESS;
}

namespace {
// Where `rc` holds `key`: 1 and its batch index when a batch is bound to it (2 once this link saw
// it released), 3 when only the cache is tagged with it, 0 when neither.
int KeyIn(const RemoteCache &rc, int64_t key, uint32_t *batch_index) {
  for (size_t b = 0; b < rc.batch_keys.size(); ++b)
    if (rc.batch_keys[b] == key) {
      std::shared_lock<std::shared_mutex> g(rc.live->mu);
      if (rc.live->released_keys.count(key) != 0) return 2;  // released since it was described (keys.cc)
      *batch_index = static_cast<uint32_t>(b);
      return 1;
    }
  if (rc.key == key) {
    *batch_index = 0;
    return 3;
  }
  return 0;
}
}  // namespace

// A batch bound to `key` (else a cache tagged with it): the link-time table, then caches learned
// since, then the peer is asked once (CACHE_QUERY by batch key) and its answer searched the same way.
Status Impl::FindRemoteKey(uint64_t cluster_id, int64_t key, int64_t *cache_id, uint32_t *batch_index) {
  Transfer t;
  Status st;
  if ((st = FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
  if (key < 0)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache with key %lld", (unsigned long long)cluster_id,
                (long long)key);
  auto released = [&] {
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu released key %lld", (unsigned long long)cluster_id,
                (long long)key);
  };
  int64_t tagged = -1;  // a cache tagged with the key, when no batch is bound to it
  for (const auto &kv : t.link->caches) {
    const int where = KeyIn(kv.second, key, batch_index);
    if (where == 1) {
      *cache_id = kv.first;
      return LLM_SUCCESS;
    }
    if (where == 2) return released();
    if (where == 3 && tagged < 0) tagged = kv.first;
  }
  if (tagged < 0) {
    std::shared_lock<std::shared_mutex> g(t.link->late_mu);
    for (const auto &kv : t.link->late) {
      const int where = KeyIn(*kv.second, key, batch_index);
      if (where == 1) {
        *cache_id = kv.first;
        return LLM_SUCCESS;
      }
      if (where == 2) return released();
      if (where == 3 && tagged < 0) tagged = kv.first;
    }
  }
  if (tagged >= 0) {
    *cache_id = tagged;
    *batch_index = 0;
    return LLM_SUCCESS;
  }
  std::shared_ptr<RemoteCache> rc;
  if ((st = late_->FindKey(t.link, kQueryByBatchKey, key, NowNs() + wait_time_ms_ * kMsNs, &rc)) != LLM_SUCCESS)
    return st;
  const int where = KeyIn(*rc, key, batch_index);  // the answer holds it (engine/late.cc checked)
  if (where == 2) return released();
  *cache_id = rc->id;
  if (where != 1) *batch_index = 0;
  return LLM_SUCCESS;
}

// Row src.batch_index of a contiguous remote cache, cut into local blocks: chunk j -> dst_blocks[j].
// The local half of a pull into blocks, in CANN's order: local cache, layer math, link, local
// bounds; then the remote cache (the caller checks its kind and bounds).
Status Impl::PullIntoBlocks(Transfer *t, const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &dst_blocks,
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

Status Impl::PullRowToBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &dst_blocks,
                             const KvCacheExtParam &ext) {
  Transfer t;
  return Tally(&t, PullRowToBlocksOn(t, src, dst, dst_blocks, ext));
}

Status Impl::PullRowToBlocksOn(Transfer &t, const CacheIndex &src, const Cache &dst,
                               const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Status st;
  if ((st = Begin(&t, true)) != LLM_SUCCESS) return st;
  if ((st = CheckPullRanges(ext)) != LLM_SUCCESS) return st;
  if (dst_blocks.empty()) return Fail(LLM_PARAM_INVALID, "dst_blocks is empty");
  if (src.cluster_id == cluster_id_) return Fail(LLM_PARAM_INVALID, "src_index.cluster_id is this engine's own");
  bool explicit_range;
  TensorSpan span;
  if ((st = PullIntoBlocks(&t, src, dst, dst_blocks, ext, &explicit_range, &span)) != LLM_SUCCESS) return st;
  const CacheEntry &lc = *t.local;
  const RemoteCache &rc = *t.remote;
  if (rc.kind == CacheKind::kBlocks) return Fail(LLM_PARAM_INVALID, "remote cache %lld holds blocks, not batches", (long long)rc.id);
  if ((st = CheckRemoteSpan(span, explicit_range, rc, lc.num_tensors)) != LLM_SUCCESS) return st;
  if (src.batch_index >= rc.batch_size)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "src_index.batch_index=%u is out of range for remote cache %lld (%llu batches)",
                src.batch_index, (long long)rc.id, (unsigned long long)rc.batch_size);
  const uint64_t chunks = (rc.stride + lc.stride - 1) / lc.stride;
  if (dst_blocks.size() > chunks)
    return Fail(LLM_PARAM_INVALID, "%zu dst_blocks for a %llu-byte remote row of %llu local blocks", dst_blocks.size(),
                (unsigned long long)rc.stride, (unsigned long long)chunks);
  t.plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  for (size_t j = 0; j < dst_blocks.size(); ++j) {
    const uint64_t off = j * lc.stride;
    t.plan.AddRange(src.batch_index * rc.stride + off, dst_blocks[j] * lc.stride, std::min(lc.stride, rc.stride - off));
  }
  return Execute(&t, true);
}

std::string Impl::LinkPath(uint64_t cluster_id) {
  auto link = links_.FindAlive(cluster_id);
  return link ? link->PathName() : "";
}

std::shared_ptr<void> Impl::PinCacheMemory(int64_t cache_id) {
  auto e = caches_.Find(cache_id);
  return e ? std::shared_ptr<void>(e->region) : nullptr;
}

int Impl::LinkChannels(uint64_t cluster_id) {
  auto link = links_.Find(cluster_id);
  if (!link) return 0;
  std::lock_guard<std::mutex> g(link->mu);
  return static_cast<int>(link->fds.size());
}

}  // namespace kvblocks
