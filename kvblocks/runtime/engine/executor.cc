// SPDX-License-Identifier: Apache-2.0
// Runs checked transfers on their paths: synchronous, detached, pipelined (engine/executor.h).
#include "engine/executor.h"

#include <utility>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "metrics/stats.h"
#include "transport/path.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

// ------------------------------------------------------------------ on the calling thread
Status Executor::Run(Transfer *t, bool pull) {
  Status st = RunOne(t, pull);
  for (size_t i = 0; st == LLM_SUCCESS && i < t->rest.size(); ++i) {
    Transfer *p = t->rest[i].get();
    p->remote_use.reset(new RemoteUse(*p->remote));
    if (!p->remote_use->ok)
      return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu unregistered cache %lld",
                  static_cast<unsigned long long>(p->link->remote_cluster_id), static_cast<long long>(p->remote->id));
    st = RunOne(p, pull);
    p->remote_use.reset();
  }
  return st;
}

Status Executor::RunOne(Transfer *t, bool pull) {
  CacheUse use(*t->local);
  if (!use.ok) return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld was unregistered", static_cast<long long>(t->local->id));
  metrics::Busy busy(t->link->stats->Path(t->remote->path->name()));
  return Conclude(t, pull, t->remote->path->Execute(t->plan, *t->local, pull, t->deadline));
}

Status Executor::Conclude(Transfer *t, bool pull, Status st) {
  // A timed-out or broken transfer leaves the link unusable, as in CANN: re-link to recover.
  if (st == LLM_TIMEOUT || st == LLM_LINK_FAILED) t->link->Fail();
  if (st == LLM_TIMEOUT) {
    // The deadline and its option first, whatever the socket said (it only saw "no answer in time").
    const std::string below = LastErrorMessage();
    return Restate(st, "%s cluster %llu did not complete within llm.SyncKvCacheWaitTime=%lld ms%s%s%s; the link is "
                   "now broken", pull ? "pull from" : "push to", static_cast<unsigned long long>(t->link->remote_cluster_id),
                   static_cast<long long>(*v_.wait_ms), below.empty() ? "" : " (", below.c_str(), below.empty() ? "" : ")");
  }
  if (st == LLM_LINK_FAILED)
    return Fail(st, "the link to cluster %llu failed", static_cast<unsigned long long>(t->link->remote_cluster_id));
  return st;
}

namespace {
uint64_t PlanBytes(const Transfer *t) {
  uint64_t n = t->plan.total_bytes();
  for (const auto &p : t->rest) n += p->plan.total_bytes();
  return n;
}
}  // namespace

// The peer is the link's (none: the call failed before it found one); the path is the remote
// cache's, so a new transport needs nothing here.
Status Executor::Tally(const Transfer *t, Status st) {
  metrics::PeerStats &peer = t->link ? *t->link->stats : v_.stats->none();
  const char *path = t->remote != nullptr ? t->remote->path->name() : "none";
  peer.Finish(path, t->kind, st, st == LLM_SUCCESS ? PlanBytes(t) : 0, NowNs() - t->start_ns);
  return st;
}

// ------------------------------------------------------------------ detached
// A prepared transfer leaves the submitting thread without its locks: a lock is released by the
// thread that took it. What it keeps (the cache entry, the link, the remote cache) are references.
void Executor::Detach(Transfer *t) {
  t->remote_use.reset();
  t->state.unlock();
}

// On the worker: take again what Run needs, and re-check what may have changed since the
// submission. A transfer still queued at its deadline fails with LLM_TIMEOUT but moved nothing,
// so it leaves the link intact.
Status Executor::RunDetached(Transfer *t, bool pull) {
  const Status st = Resume(t, pull);
  return st != LLM_SUCCESS ? st : ConcludeDetached(t, pull, Run(t, pull));
}

Status Executor::Resume(Transfer *t, bool pull) {
  t->state = std::shared_lock<std::shared_mutex>(*v_.state_mu);
  const char *what = pull ? "pull" : "push";
  const unsigned long long peer = t->link->remote_cluster_id;
  if (!v_.initialized->load(std::memory_order_acquire))
    return Fail(LLM_FAILED, "the engine was finalized before the %s started", what);
  if (NowNs() >= t->deadline)
    return Fail(LLM_TIMEOUT, "%s did not start within llm.SyncKvCacheWaitTime=%lld ms of its submission; nothing "
                "moved", what, static_cast<long long>(*v_.wait_ms));
  if (!t->link->alive.load()) return Fail(LLM_LINK_FAILED, "the link to cluster %llu failed before the %s started", peer, what);
  t->remote_use.reset(new RemoteUse(*t->remote));
  if (!t->remote_use->ok)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu unregistered cache %lld", peer, static_cast<long long>(t->remote->id));
  return LLM_SUCCESS;
}

Status Executor::ConcludeDetached(Transfer *t, bool pull, Status st) {
  const char *what = pull ? "pull" : "push";
  const unsigned long long peer = t->link->remote_cluster_id;
  if (st == LLM_NOT_YET_LINK || st == LLM_LINK_FAILED)  // no-op when the path gave a reason
    Fail(st, "the link to cluster %llu broke while the %s was in flight (a transfer on it timed out or failed)",
         peer, what);
  return st;
}

// One layer's plan on a detached transfer: takes the locks, runs it, lets them go again.
// The plan is swapped in and out, so a layer costs no allocation.
Status Executor::RunLayer(Transfer *t, Plan *plan, int64_t deadline) {
  std::swap(t->plan, *plan);
  t->deadline = deadline;
  t->start_ns = NowNs();
  t->kind = metrics::kPushLayerwise;
  const Status st = Tally(t, RunDetached(t, false));
  Detach(t);
  std::swap(t->plan, *plan);
  return st;
}

// A pipelined run (engine/async.cc) shares one channel between the transfers of one key.
const void *Executor::PipelineKey(const Transfer *t, bool pull) { return t->remote->path->PipelineKey(t->plan, pull); }

namespace {
bool OneSided(const Transfer *t) { return t->remote->path->mode() == PathMode::kLocalCopy; }
}  // namespace

// A one-sided copy small enough that the worker running it is soon free again.
bool Executor::BriefCopy(const Transfer *t) { return OneSided(t) && t->plan.total_bytes() <= kBriefCopyBytes; }

// A one-sided copy small enough to run on the submitting thread.
bool Executor::InlineCopy(const Transfer *t) { return OneSided(t) && t->plan.total_bytes() <= kInlineCopyBytes; }

// On the worker, for a transfer joining a pipelined run: what RunDetached checks and Run holds,
// kept in the transfer until FinishPiped.
Status Executor::StartPiped(Transfer *t, bool pull, PipeItem *item) {
  Status st = Resume(t, pull);
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

Status Executor::FinishPiped(Transfer *t, bool pull, Status st) {
  metrics::Busy::Leave(t->link->stats->Path(t->remote->path->name()));
  return ConcludeDetached(t, pull, Conclude(t, pull, st));
}

}  // namespace kvblocks
