// SPDX-License-Identifier: Apache-2.0
// Pull/Push of blocks and batches: the checks in CANN's order and the plan (engine/checks.h), then
// the plan executed on the remote cache's path.
#include <algorithm>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "kvblocks/error.h"
#include "common/util.h"
#include "engine/checks.h"
#include "engine/engine.h"
#include "engine/late.h"
#include "engine/transfer.h"
#include "plan/plan.h"

namespace kvblocks {

// ------------------------------------------------------------------ execution
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
  const Status st = checks_->PullBlocks(&t, src, dst, src_blocks, dst_blocks, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, true));
}

Status Impl::PushBlocks(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPushBlocks;
  const Status st = checks_->PushBlocks(&t, src, dst, src_blocks, dst_blocks, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, false));
}

// ------------------------------------------------------------------ batches
Status Impl::PullCache(const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPullCache;
  const Status st = checks_->PullCache(&t, src, dst, batch_index, size, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, true));
}

Status Impl::PushCache(const Cache &src, const CacheIndex &dst, uint32_t src_batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPushCache;
  const Status st = checks_->PushCache(&t, src, dst, src_batch_index, size, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, false));
}

// ------------------------------------------------------------------ asynchronous (engine/async.cc)
void TransferFree::operator()(Transfer *t) const { delete t; }

TransferPtr Impl::NewTransfer() { return TransferPtr(new Transfer); }

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
  if ((st = checks_->FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
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
  if ((st = checks_->FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
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
  if ((st = checks_->FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
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

Status Impl::PullRowToBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &dst_blocks,
                             const KvCacheExtParam &ext) {
  Transfer t;
  const Status st = checks_->PullRowToBlocks(&t, src, dst, dst_blocks, ext);
  return Tally(&t, st != LLM_SUCCESS ? st : Execute(&t, true));
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
