// SPDX-License-Identifier: Apache-2.0
// Asynchronous transfers: the caller's thread runs every check of the synchronous call and builds
// the plan (engine/checks.h); a pool of runtime threads, started on first use, moves the bytes
// (engine/executor.h) and completes the handle (include/kvblocks/async.h).
#ifndef KVBLOCKS_RUNTIME_ENGINE_ASYNC_H_
#define KVBLOCKS_RUNTIME_ENGINE_ASYNC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/transfer.h"
#include "kvblocks/async.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

class AsyncPool;
class Checks;
class Executor;

class Async {
 public:
  Async(Checks *checks, Executor *exec) : checks_(checks), exec_(exec) {}
  // Runs what is queued (the engine is finalized by then, so those jobs fail at once) and joins.
  ~Async();
  Async(const Async &) = delete;
  Async &operator=(const Async &) = delete;

  // Blocks transfers; every request is checked (as the synchronous call) before any is submitted.
  // `failed`: the index of the request that failed. Returns the checks' status (Checks::Blocks).
  llm_datadist::Status SubmitBlocks(const BlocksRequest *reqs, size_t n, TransferHandle *out, size_t *failed);
  // One request, without copying its lists into a BlocksRequest (the submission fast path). A small
  // one-sided copy runs here, its handle returned done.
  llm_datadist::Status SubmitOne(bool pull, const llm_datadist::CacheIndex &remote, const llm_datadist::Cache &local,
                                 const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                 const llm_datadist::KvCacheExtParam &ext, TransferHandle *out);
  // A transfer checked and detached elsewhere (ranges, prepared transfers); its plans (t->rest
  // too) run in order on one worker, never in a pipelined run.
  void Submit(TransferPtr t, bool pull, TransferHandle *out);

 private:
  std::shared_ptr<AsyncPool> Pool();
  void Post(AsyncPool &pool, TransferPtr t, bool pull, TransferHandle *out);

  Checks *const checks_;
  Executor *const exec_;
  std::mutex mu_;
  std::shared_ptr<AsyncPool> pool_;  // started on first use
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_ASYNC_H_
