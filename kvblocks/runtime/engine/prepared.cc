// SPDX-License-Identifier: Apache-2.0
// Prepared transfers (include/kvblocks/layout.h): every check of PullKvBlocks / PushKvBlocks and
// the plan run once; an execution only finds the caches and the link again and checks that the plan
// still fits both tables (a few comparisons, whatever the plan's size), then moves the bytes.
#include <algorithm>
#include <mutex>

#include "common/error.h"
#include "common/util.h"
#include "engine/async.h"
#include "engine/checks.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/transfer.h"
#include "plan/plan.h"

namespace kvblocks {

struct PreparedState {
  const Impl *engine = nullptr;
  bool pull = true;
  uint64_t cluster_id = 0;
  int64_t remote_id = 0, local_id = 0;
  uint64_t remote_stride = 0, local_stride = 0;
  uint32_t remote_tensors = 0, local_tensors = 0;  // highest tensor index + 1 on each side
  uint64_t remote_extent = 0, local_extent = 0;    // highest byte end in a tensor on each side
  PreparedInfo info;
  std::mutex mu;                                   // one execution at a time (it lends out `plan`)
  Plan plan;
};

// Taken at preparation: `plan` is lent out while an execution runs.
PreparedInfo DescribePrepared(const PreparedState &p) { return p.info; }

namespace {

void Extents(PreparedState *p) {
  const Plan &pl = p->plan;
  uint64_t src_end = 0, dst_end = 0;
  for (const Segment &g : pl.segs) {
    src_end = std::max(src_end, g.src_off + g.len);
    dst_end = std::max(dst_end, g.dst_off + g.len);
  }
  const uint32_t src_t = pl.src_tensors.empty() ? 0 : pl.src_tensors.back() + 1;  // PairTensors: ascending
  const uint32_t dst_t = pl.dst_tensors.empty() ? 0 : pl.dst_tensors.back() + 1;
  p->remote_extent = p->pull ? src_end : dst_end;
  p->local_extent = p->pull ? dst_end : src_end;
  p->remote_tensors = p->pull ? src_t : dst_t;
  p->local_tensors = p->pull ? dst_t : src_t;
}

// A cache id names one registration, but say so plainly if what it names no longer fits.
Status CheckFits(const PreparedState &p, const CacheEntry &lc, const RemoteCache &rc) {
  if (lc.stride != p.local_stride || lc.num_tensors < p.local_tensors || lc.tensor_bytes < p.local_extent)
    return Fail(LLM_PARAM_INVALID, "local cache %lld no longer fits the prepared transfer", (long long)lc.id);
  if (rc.stride != p.remote_stride || rc.num_tensors < p.remote_tensors || rc.tensor_bytes < p.remote_extent)
    return Fail(LLM_PARAM_INVALID, "remote cache %lld no longer fits the prepared transfer", (long long)rc.id);
  return LLM_SUCCESS;
}

}  // namespace

Status Impl::PrepareTransfer(const BlocksRequest &r, const LayoutTransform *xf, PreparedTransfer *out) {
  Transfer t;
  const Status st = checks_->Blocks(&t, r.pull, r.remote, r.local, r.src_blocks, r.dst_blocks, r.ext, xf);
  if (st != LLM_SUCCESS) return st;
  auto p = std::make_shared<PreparedState>();
  p->engine = this;
  p->pull = r.pull;
  p->cluster_id = r.remote.cluster_id;
  p->remote_id = r.remote.cache_id;
  p->local_id = r.local.cache_id;
  p->remote_stride = t.remote->stride;
  p->local_stride = t.local->stride;
  p->plan = std::move(t.plan);
  p->info.bytes = p->plan.total_bytes();
  p->info.segments = p->plan.segs.size();
  p->info.pairs = p->plan.src_tensors.size();
  Extents(p.get());
  *out = PreparedTransfer(std::move(p));
  return LLM_SUCCESS;
}

Status Impl::ExecutePrepared(PreparedState &p) {
  if (p.engine != this) return Fail(LLM_PARAM_INVALID, "the transfer was prepared by another engine");
  Transfer t;
  t.kind = p.pull ? metrics::kPullBlocks : metrics::kPushBlocks;
  Status st;
  if ((st = checks_->Begin(&t, p.pull)) != LLM_SUCCESS || (st = checks_->FindLocal(&t, p.local_id)) != LLM_SUCCESS ||
      (st = checks_->FindLink(&t, p.cluster_id)) != LLM_SUCCESS || (st = checks_->FindRemote(&t, p.remote_id)) != LLM_SUCCESS ||
      (st = CheckFits(p, *t.local, *t.remote)) != LLM_SUCCESS)
    return exec_->Tally(&t, st);
  std::lock_guard<std::mutex> g(p.mu);
  std::swap(t.plan, p.plan);  // lent, not copied: an execution costs nothing per segment
  st = exec_->Tally(&t, exec_->Run(&t, p.pull));
  std::swap(t.plan, p.plan);
  return st;
}

// As ExecutePrepared, on a runtime worker: the transfer takes a copy of the plan.
Status Impl::ExecutePreparedAsync(PreparedState &p, TransferHandle *out) {
  if (p.engine != this) return Fail(LLM_PARAM_INVALID, "the transfer was prepared by another engine");
  TransferPtr t = NewTransfer();
  t->kind = p.pull ? metrics::kPullBlocksAsync : metrics::kPushBlocksAsync;
  Status st;
  if ((st = checks_->Begin(t.get(), p.pull)) != LLM_SUCCESS || (st = checks_->FindLocal(t.get(), p.local_id)) != LLM_SUCCESS ||
      (st = checks_->FindLink(t.get(), p.cluster_id)) != LLM_SUCCESS || (st = checks_->FindRemote(t.get(), p.remote_id)) != LLM_SUCCESS ||
      (st = CheckFits(p, *t->local, *t->remote)) != LLM_SUCCESS)
    return exec_->Tally(t.get(), st);
  {
    std::lock_guard<std::mutex> g(p.mu);
    t->plan = p.plan;
  }
  Executor::Detach(t.get());
  async_->Submit(std::move(t), p.pull, out);
  return LLM_SUCCESS;
}

}  // namespace kvblocks
