// SPDX-License-Identifier: Apache-2.0
// The executor: runs checked transfers (engine/checks.h) on their remote cache's path, on the
// calling thread (Run), detached from the thread that checked them (Detach, then RunDetached or
// RunLayer on a worker), or as part of a pipelined run of one channel (StartPiped / FinishPiped);
// and counts each transfer's end (Tally). It sees the engine through ExecView only.
#ifndef KVBLOCKS_RUNTIME_ENGINE_EXECUTOR_H_
#define KVBLOCKS_RUNTIME_ENGINE_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <shared_mutex>

#include "engine/transfer.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct PipeItem;

// What the executor reads of the engine that owns it.
struct ExecView {
  std::shared_mutex *state_mu;           // a detached transfer takes it again (shared) to run
  const std::atomic<bool> *initialized;  // initialized and not finalized
  const int64_t *wait_ms;                // llm.SyncKvCacheWaitTime, named in a timeout's reason
  metrics::EngineStats *stats;           // where a transfer without a link is counted
};

class Executor {
 public:
  explicit Executor(const ExecView &v) : v_(v) {}

  // Runs t's plan, then each of t->rest in order, on the calling thread with the locks the checks
  // took. A timeout or a broken link leaves the link failed (re-link to recover, as in CANN).
  // Returns the path's status: LLM_TIMEOUT, LLM_LINK_FAILED, LLM_KV_CACHE_NOT_EXIST (a cache was
  // unregistered meanwhile), ...
  llm_datadist::Status Run(Transfer *t, bool pull);
  // Counts t's end (its kind, path, peer, bytes, latency) and returns st.
  llm_datadist::Status Tally(const Transfer *t, llm_datadist::Status st);

  // A checked transfer leaves the checking thread without its locks (a lock is released by the
  // thread that took it); what it keeps are references.
  static void Detach(Transfer *t);
  // On a worker: takes the locks again, re-checks what may have changed since the submission
  // (LLM_FAILED once finalized, LLM_TIMEOUT when still queued at its deadline (nothing moved, the
  // link stays), LLM_LINK_FAILED, LLM_KV_CACHE_NOT_EXIST), then Run.
  llm_datadist::Status RunDetached(Transfer *t, bool pull);
  // One layer of a layer-wise push on a detached push transfer: `plan` is swapped in and out (no
  // allocation per layer); tallied; the transfer is detached again after.
  llm_datadist::Status RunLayer(Transfer *t, Plan *plan, int64_t deadline);

  // Pipelined runs (engine/async.cc) share one channel between the transfers of one key.
  static const void *PipelineKey(const Transfer *t, bool pull);  // null: runs alone
  static bool BriefCopy(const Transfer *t);   // a one-sided copy whose worker is soon free again
  static bool InlineCopy(const Transfer *t);  // a one-sided copy small enough for the submitting thread
  // A transfer joining a pipelined run: RunDetached's checks, and what Run holds, kept in the
  // transfer until FinishPiped; fills `item` for the path.
  llm_datadist::Status StartPiped(Transfer *t, bool pull, PipeItem *item);
  llm_datadist::Status FinishPiped(Transfer *t, bool pull, llm_datadist::Status st);

 private:
  llm_datadist::Status RunOne(Transfer *t, bool pull);
  llm_datadist::Status Conclude(Transfer *t, bool pull, llm_datadist::Status st);
  llm_datadist::Status Resume(Transfer *t, bool pull);
  llm_datadist::Status ConcludeDetached(Transfer *t, bool pull, llm_datadist::Status st);

  const ExecView v_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_EXECUTOR_H_
