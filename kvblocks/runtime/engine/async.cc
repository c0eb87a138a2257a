// SPDX-License-Identifier: Apache-2.0
// Asynchronous blocks transfers: the caller's thread runs every check of the synchronous call and
// builds the plan (Impl::PrepareBlocks); a pool of runtime threads moves the bytes
// (Impl::ExecuteDetached) and completes the handle. Completion needs no caller thread.
#include <sched.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <string>
#include <system_error>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "engine/engine.h"
#include "kvblocks/async.h"

namespace kvblocks {

// The shared state behind TransferHandle.
struct TransferState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  Status status = LLM_WAIT_PROC_TIMEOUT;
  std::string message;

  void Complete(Status st, const char *why) {
    {
      std::lock_guard<std::mutex> g(mu);
      status = st;
      if (st != LLM_SUCCESS) message = why;
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
};

// Worker threads, started on demand up to kMaxAsyncThreads. The destructor runs what is queued
// (an engine being destroyed is finalized, so those jobs fail at once) and joins.
class AsyncPool {
 public:
  struct Job {
    TransferPtr t;
    bool pull;
    std::shared_ptr<TransferState> s;
  };

  explicit AsyncPool(Impl *impl) : impl_(impl) {}

  ~AsyncPool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto &th : threads_) th.join();
  }

  // Queues the job; false when no worker exists and none could be started (the caller runs it).
  bool Post(Job &job) {
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      // A new worker when the queued jobs outnumber the free ones (asleep or spinning).
      const size_t free_workers = idle_ + (spinning_.load(std::memory_order_relaxed) ? 1 : 0);
      if (q_.size() + 1 > free_workers && threads_.size() < kMaxAsyncThreads) {
        try {
          threads_.emplace_back([this] { Loop(); });
        } catch (const std::system_error &) {
          if (threads_.empty()) return false;
        }
      }
      q_.push_back(std::move(job));
      queued_.store(q_.size(), std::memory_order_release);
      // The spinning worker takes one job without a wake-up; more jobs wake sleeping workers.
      wake = idle_ > 0 && (!spinning_.load(std::memory_order_relaxed) || q_.size() > 1);
    }
    if (wake) cv_.notify_one();
    return true;
  }

 private:
  // Yields rather than pauses: on a machine with more runnable threads than cores the spinner
  // must not take the submitter's (or the peer's) core.
  static void Relax() { sched_yield(); }

  // Polls the queue for kAsyncSpinUs without the lock; true when a job may be there.
  bool Spin() {
    const int64_t until = NowNs() + kAsyncSpinUs * 1000;
    for (int i = 0;; ++i) {
      if (queued_.load(std::memory_order_acquire) != 0) return true;
      if ((i & 7) == 7 && NowNs() >= until) return false;
      Relax();
    }
  }

  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (q_.empty()) {
        if (stop_) return;
        bool expected = false;
        if (spinning_.compare_exchange_strong(expected, true)) {  // one spinner at a time
          lk.unlock();
          const bool got = Spin();
          lk.lock();
          spinning_.store(false);
          if (got) continue;
          if (!q_.empty()) continue;
        }
        ++idle_;
        cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
        --idle_;
        continue;
      }
      Job job = std::move(q_.front());
      q_.pop_front();
      queued_.store(q_.size(), std::memory_order_release);
      const bool more = !q_.empty() && idle_ > 0;
      lk.unlock();
      if (more) cv_.notify_one();
      impl_->RunDetached(std::move(job.t), job.pull, job.s);
      lk.lock();
    }
  }

  Impl *const impl_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> q_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> queued_{0};     // q_.size(), readable without the lock
  std::atomic<bool> spinning_{false};  // a worker is polling the queue
  size_t idle_ = 0;                    // workers asleep on cv_
  bool stop_ = false;
};

void Impl::RunDetached(TransferPtr t, bool pull, const std::shared_ptr<TransferState> &s) {
  ClearLastError();
  Status st;
  try {
    st = ExecuteDetached(t.get(), pull);
  } catch (const std::bad_alloc &) {
    st = Fail(LLM_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    st = Fail(LLM_FAILED, "internal error: %s", e.what());
  } catch (...) {
    st = Fail(LLM_FAILED, "internal error");
  }
  t.reset();  // releases the engine, cache and link locks before anyone is woken
  s->Complete(st, LastErrorMessage());
}

Status Impl::SubmitBlocks(const BlocksRequest *reqs, size_t n, TransferHandle *out, size_t *failed) {
  std::vector<TransferPtr> prepared;
  prepared.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TransferPtr t = NewTransfer();
    const Status st = PrepareBlocks(t.get(), reqs[i]);
    if (st != LLM_SUCCESS) {
      *failed = i;
      return st;  // `prepared` holds no lock: nothing was submitted
    }
    Detach(t.get());
    prepared.push_back(std::move(t));
  }
  std::shared_ptr<AsyncPool> pool;
  {
    std::lock_guard<std::mutex> g(async_mu_);
    if (!async_) async_ = std::make_shared<AsyncPool>(this);
    pool = async_;
  }
  for (size_t i = 0; i < n; ++i) {
    auto s = std::make_shared<TransferState>();
    out[i] = TransferHandle(s);
    AsyncPool::Job job{std::move(prepared[i]), reqs[i].pull, s};
    if (!pool->Post(job)) RunDetached(std::move(job.t), job.pull, s);
  }
  return LLM_SUCCESS;
}

// A transfer prepared and detached elsewhere (ranges.cc), run like a submitted blocks transfer.
void Impl::SubmitPrepared(TransferPtr t, bool pull, TransferHandle *out) {
  std::shared_ptr<AsyncPool> pool;
  {
    std::lock_guard<std::mutex> g(async_mu_);
    if (!async_) async_ = std::make_shared<AsyncPool>(this);
    pool = async_;
  }
  auto s = std::make_shared<TransferState>();
  *out = TransferHandle(s);
  AsyncPool::Job job{std::move(t), pull, s};
  if (!pool->Post(job)) RunDetached(std::move(job.t), job.pull, s);
}

// ------------------------------------------------------------------ TransferHandle
bool TransferHandle::Done() const noexcept { return !s_ || s_->done.load(std::memory_order_acquire); }

llm_datadist::Status TransferHandle::Status() const noexcept {
  if (!s_) return LLM_FAILED;
  if (!s_->done.load(std::memory_order_acquire)) return LLM_WAIT_PROC_TIMEOUT;
  return s_->status;
}

const char *TransferHandle::Message() const noexcept {
  if (!s_) return "empty transfer handle";
  return s_->done.load(std::memory_order_acquire) ? s_->message.c_str() : "";
}

llm_datadist::Status TransferHandle::Wait(int64_t timeout_ms) const noexcept {
  ClearLastError();
  if (!s_) return Fail(LLM_FAILED, "empty transfer handle");
  if (!s_->done.load(std::memory_order_acquire)) {
    try {
      std::unique_lock<std::mutex> lk(s_->mu);
      auto ready = [this] { return s_->done.load(std::memory_order_relaxed); };
      if (timeout_ms < 0) {
        s_->cv.wait(lk, ready);
      } else if (!s_->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready)) {
        return LLM_WAIT_PROC_TIMEOUT;
      }
    } catch (...) {
      return Fail(LLM_FAILED, "internal error while waiting");
    }
  }
  if (s_->status != LLM_SUCCESS) Fail(s_->status, "%s", s_->message.c_str());
  return s_->status;
}

}  // namespace kvblocks
