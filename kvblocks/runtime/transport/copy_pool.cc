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
  std::atomic<int> active{0};  // pool threads inside Work; the last touch of a Job is their decrement
  int caller_cpu = -1;
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

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// One job at a time; a caller that finds the pool busy copies alone. Never destroyed (its threads
// wait on it until exit); a forked child, which has none of the threads, copies alone.
//
// A helper that finished a job watches for the next one for kPoolSpinNs before it sleeps: a
// sleeping thread on a virtual machine takes tens of microseconds to wake, most of the gain of a
// 2 MiB split, and back-to-back calls are the common case. A spin that the scheduler cut short
// (the other cores are busy) ends it early.
class Pool {
 public:
  static Pool &Get() {
    static Pool *pool = new Pool();
    return *pool;
  }

  size_t threads() const { return threads_; }

  bool Run(Job &j) {
    if (threads_ == 0 || getpid() != pid_) return false;
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (job_ != nullptr) return false;
      j.caller_cpu = sched_getcpu();
      job_ = &j;
      gen_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) wake_.notify_all();
    Work(j);
    std::unique_lock<std::mutex> g(mu_);
    job_ = nullptr;  // no thread joins from here on
    g.unlock();
    Join(j);
    return true;
  }

 private:
  Pool() : pid_(getpid()) {
    size_t usable = std::max(1u, std::thread::hardware_concurrency());
    if (sched_getaffinity(0, sizeof(cpus_), &cpus_) == 0) usable = static_cast<size_t>(CPU_COUNT(&cpus_));
    else CPU_ZERO(&cpus_);  // MoveOff then never moves
    const size_t want = std::min(usable, kMaxCopyThreads) - 1;
    AsyncSignalsBlocked quiet;  // copy threads take no process signals, as every runtime thread
    for (; threads_ < want; ++threads_) {
      try {
        std::thread([this] { Loop(); }).detach();
      } catch (const std::system_error &) {
        break;  // fewer helpers; the caller's thread still copies
      }
    }
  }

  // Spins until done() or kPoolSpinNs pass, or the spin was cut short by the scheduler; true if
  // done() held.
  template <typename Done>
  static bool Spin(Done &&done) {
    const int64_t t0 = NowNs(), until = t0 + kPoolSpinNs;
    for (int64_t last = t0; !done(); ) {
      for (int i = 0; i < 64; ++i) CpuRelax();
      const int64_t now = NowNs();
      if (now >= until || now - last > kPoolSpinNs / 4) return false;  // timed out, or preempted
      last = now;
    }
    return true;
  }

  // Waits for the helpers still inside j: each is on its last chunk, so spin first.
  void Join(Job &j) {
    auto done = [&] { return j.active.load(std::memory_order_acquire) == 0; };
    if (Spin(done)) return;
    std::unique_lock<std::mutex> g(mu_);
    ++joiners_;
    idle_.wait(g, done);
    --joiners_;
  }

  // A helper woken on its caller's CPU only takes turns with it. A guest's scheduler can put it
  // there with another vCPU idle (seen with perf sched on a 2-vCPU VM), and it stays: the two wake
  // each other up, 3x slower than one thread. Moving once, by affinity, breaks that.
  void MoveOff(int cpu) const {
    cpu_set_t others = cpus_;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0 || sched_setaffinity(0, sizeof(others), &others) != 0) return;
    sched_setaffinity(0, sizeof(cpus_), &cpus_);  // free to move again; stays put until it has to
  }

  void Loop() {
    uint64_t seen = 0;
    for (;;) {
      Spin([&] { return gen_.load(std::memory_order_acquire) != seen; });
      std::unique_lock<std::mutex> g(mu_);
      ++sleepers_;
      wake_.wait(g, [&] { return job_ != nullptr && gen_.load(std::memory_order_relaxed) != seen; });
      --sleepers_;
      seen = gen_.load(std::memory_order_relaxed);
      Job *j = job_;
      j->active.fetch_add(1, std::memory_order_relaxed);
      g.unlock();
      if (sched_getcpu() == j->caller_cpu) MoveOff(j->caller_cpu);
      Work(*j);
      const bool last = j->active.fetch_sub(1, std::memory_order_acq_rel) == 1;  // j may be gone now
      g.lock();
      if (last && joiners_ > 0) idle_.notify_all();
    }
  }

  const pid_t pid_;
  cpu_set_t cpus_;  // the process's CPUs when the pool started
  size_t threads_ = 0;
  std::mutex mu_;
  std::condition_variable wake_, idle_;
  Job *job_ = nullptr;            // guarded by mu_
  std::atomic<uint64_t> gen_{0};  // written under mu_; watched without it
  int sleepers_ = 0, joiners_ = 0;  // threads asleep on wake_ and idle_; guarded by mu_
};

}  // namespace

size_t CopyThreads() { return Pool::Get().threads(); }

Status RunChunks(size_t n, uint64_t bytes, ChunkFn fn) {
  Job j{fn, n};
  if (bytes < kParallelBytes || n < 2 || !Pool::Get().Run(j)) Work(j);
  return j.failure.load();
}

}  // namespace kvblocks
