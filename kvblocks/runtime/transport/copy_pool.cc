// SPDX-License-Identifier: Apache-2.0
#include "transport/copy_pool.h"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/limits.h"
#include "common/util.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

Chunking::Chunking(const Plan &plan, uint64_t chunk_bytes) : plan_(plan) {
  const uint64_t per = plan.bytes_per_tensor, pairs = plan.src_tensors.size();
  if (per == 0 || pairs == 0) return;
  if (per <= chunk_bytes) {
    pairs_per_chunk_ = chunk_bytes / per;
    count_ = (pairs + pairs_per_chunk_ - 1) / pairs_per_chunk_;
    return;
  }
  cuts_.push_back(Cut{0, 0});
  uint64_t acc = 0;  // bytes since the last cut
  for (size_t s = 0; s < plan.segs.size(); ++s) {
    uint64_t off = 0;
    while (plan.segs[s].len - off + acc >= chunk_bytes) {
      off += chunk_bytes - acc;
      acc = 0;
      cuts_.push_back(Cut{s, off});
    }
    acc += plan.segs[s].len - off;
  }
  if (acc > 0) cuts_.push_back(Cut{plan.segs.size(), 0});
  count_ = pairs * (cuts_.size() - 1);
}

namespace {

struct Job {
  ChunkFn fn;
  size_t n;
  std::atomic<size_t> next{0};
  std::atomic<Status> failure{LLM_SUCCESS};
  int active = 0;  // pool threads inside Work; guarded by the pool's mutex
};

void Work(Job &j) {
  for (;;) {
    const size_t c = j.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= j.n) return;
    const Status st = j.fn(c);
    if (st != LLM_SUCCESS) {
      Status ok = LLM_SUCCESS;
      j.failure.compare_exchange_strong(ok, st);
      j.next.store(j.n, std::memory_order_relaxed);  // the others stop at their next chunk
      return;
    }
  }
}

size_t UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return static_cast<size_t>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// One job at a time; a caller that finds the pool busy copies alone. Never destroyed (its threads
// wait on it until exit); a forked child, which has none of the threads, copies alone.
class Pool {
 public:
  static Pool &Get() {
    static Pool *pool = new Pool();
    return *pool;
  }

  bool Run(Job &j) {
    if (threads_ == 0 || getpid() != pid_) return false;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (job_ != nullptr) return false;
      job_ = &j;
      ++gen_;
    }
    wake_.notify_all();
    Work(j);
    std::unique_lock<std::mutex> g(mu_);
    job_ = nullptr;  // no thread joins from here on
    idle_.wait(g, [&] { return j.active == 0; });
    return true;
  }

 private:
  Pool() : pid_(getpid()) {
    const size_t want = std::min(UsableCpus(), kMaxCopyThreads) - 1;
    AsyncSignalsBlocked quiet;  // copy threads take no process signals, as every runtime thread
    for (; threads_ < want; ++threads_) {
      try {
        std::thread([this] { Loop(); }).detach();
      } catch (const std::system_error &) {
        break;  // fewer helpers; the caller's thread still copies
      }
    }
  }

  void Loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> g(mu_);
    for (;;) {
      wake_.wait(g, [&] { return job_ != nullptr && gen_ != seen; });
      seen = gen_;
      Job *j = job_;
      ++j->active;
      g.unlock();
      Work(*j);
      g.lock();
      if (--j->active == 0) idle_.notify_all();
    }
  }

  const pid_t pid_;
  size_t threads_ = 0;
  std::mutex mu_;
  std::condition_variable wake_, idle_;
  Job *job_ = nullptr;
  uint64_t gen_ = 0;
};

}  // namespace

Status RunChunks(size_t n, uint64_t bytes, ChunkFn fn) {
  Job j{fn, n};
  if (bytes < kParallelBytes || n < 2 || !Pool::Get().Run(j)) Work(j);
  return j.failure.load();
}

}  // namespace kvblocks
