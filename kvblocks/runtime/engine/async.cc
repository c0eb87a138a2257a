// SPDX-License-Identifier: Apache-2.0
// Asynchronous transfers (engine/async.h): the caller's thread runs every check of the synchronous
// call and builds the plan (engine/checks.h); a pool of runtime threads moves the bytes
// (Executor::RunDetached) and completes the handle. Completion needs no caller thread.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "engine/async.h"
#include "engine/checks.h"
#include "engine/executor.h"
#include "engine/transfer.h"
#include "kvblocks/async.h"
#include "transport/path.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants and API types

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

namespace {
void RunDetached(Executor &exec, TransferPtr t, bool pull, const std::shared_ptr<TransferState> &s);
}  // namespace

// Worker threads, started on demand up to kMaxAsyncThreads. The destructor runs what is queued
// (an engine being destroyed is finalized, so those jobs fail at once) and joins.
//
// Wake-ups cost a system call on the submitting thread, so a job wakes no one when a worker will
// take it anyway: one spinning on the queue, one finishing a short job, or the pipelined run of its
// key. Jobs with a pipeline key (small served transfers to one peer) are run together by one worker
// on one channel (Path::ExecutePipelined), which keeps taking newly queued jobs of its key.
class AsyncPool {
 public:
  struct Job {
    TransferPtr t;
    bool pull;
    std::shared_ptr<TransferState> s;
    const void *key;  // Path::PipelineKey, null: run alone
    bool brief;       // a one-sided copy small enough to end soon
  };

  explicit AsyncPool(Executor *exec) : exec_(exec) {}

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
    bool wake = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      const bool covered = Covered(job.key);
      if (!covered && !StartWorker()) return false;
      q_.push_back(std::move(job));
      queued_.store(q_.size(), std::memory_order_release);
      wake = idle_ > waking_ && !covered;
      if (wake) ++waking_;
    }
    if (wake) cv_.notify_one();
    return true;
  }

 private:
  friend class PoolFeed;

  // True when a worker will take a job about to be queued without being woken.
  bool Covered(const void *key) const {
    if (spinning_.load(std::memory_order_relaxed) && q_.empty()) return true;
    if (key != nullptr && std::find(piping_.begin(), piping_.end(), key) != piping_.end()) return true;
    // A worker already woken for a queued job of this key will run this one in the same run.
    if (key != nullptr && waking_ > 0 &&
        std::find_if(q_.begin(), q_.end(), [key](const Job &j) { return j.key == key; }) != q_.end())
      return true;
    return q_.size() < brief_ + waking_;
  }

  // Starts a worker unless a sleeping one can be woken; false when none exists and none started.
  bool StartWorker() {
    if (idle_ > q_.size() || threads_.size() >= kMaxAsyncThreads) return !threads_.empty();
    try {
      threads_.emplace_back([this] { Loop(); });
    } catch (const std::system_error &) {
      return !threads_.empty();
    }
    return true;
  }

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

  // Takes the oldest queued job of `key` (any job when null); the lock is held.
  bool Take(const void *key, Job *out) {
    auto it = q_.begin();
    if (key != nullptr) it = std::find_if(q_.begin(), q_.end(), [key](const Job &j) { return j.key == key; });
    if (it == q_.end()) return false;
    *out = std::move(*it);
    q_.erase(it);
    queued_.store(q_.size(), std::memory_order_release);
    return true;
  }

  void Run(Job job);

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
        // waking_ may only be too low (a wake-up too many), never too high (a job left asleep):
        // with the queue empty no notified worker is owed a job, and a wait is at most kIdleNs.
        waking_ = 0;
        ++idle_;
        while (!stop_ && q_.empty()) {
          const bool notified = cv_.wait_for(lk, std::chrono::nanoseconds(kIdleNs)) == std::cv_status::no_timeout;
          if (notified && waking_ > 0) --waking_;
          if (!notified) waking_ = 0;
        }
        --idle_;
        continue;
      }
      Job job;
      Take(nullptr, &job);
      if (job.brief) ++brief_;
      if (job.key != nullptr) piping_.push_back(job.key);
      const bool more = !q_.empty() && idle_ > waking_ && !Covered(q_.front().key);
      if (more) ++waking_;
      lk.unlock();
      if (more) cv_.notify_one();
      const bool brief = job.brief;
      Run(std::move(job));
      lk.lock();
      if (brief) --brief_;
    }
  }

  Executor *const exec_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> q_;
  std::vector<std::thread> threads_;
  std::vector<const void *> piping_;  // keys of the pipelined runs in progress
  std::atomic<size_t> queued_{0};     // q_.size(), readable without the lock
  std::atomic<bool> spinning_{false};  // a worker is polling the queue
  size_t idle_ = 0;                    // workers asleep on cv_
  size_t brief_ = 0;                   // workers running a brief job
  size_t waking_ = 0;                  // workers notified that have not yet woken
  bool stop_ = false;
  static constexpr int64_t kIdleNs = 10 * kMsNs;  // bounds a job's wait should a wake-up go astray
};

// Feeds one pipelined run from the pool's queue: the first job, then every job of the same key
// queued while the run lasts. The run's key leaves piping_ when the feed finds none (under the
// pool's lock, so a job posted afterwards wakes a worker).
class PoolFeed : public PipeFeed {
 public:
  PoolFeed(AsyncPool *pool, AsyncPool::Job first) : pool_(pool), key_(first.key), first_(std::move(first)) {
    ClearLastError();
  }

  // Runs the jobs on the path of the first one that passes its checks.
  void Run() {
    if (!Next(&first_item_)) return;
    ready_ = true;
    first_item_.path->ExecutePipelined(this);
  }

  bool Next(PipeItem *item) override {
    if (ready_) {  // the path's first call: the item Run started with
      ready_ = false;
      *item = first_item_;
      return true;
    }
    for (;;) {
      std::unique_ptr<AsyncPool::Job> job(new AsyncPool::Job);
      if (first_.t) {
        *job = std::move(first_);
      } else {
        std::lock_guard<std::mutex> g(pool_->mu_);
        if (!pool_->Take(key_, job.get())) {
          Leave();
          return false;
        }
        Join();
      }
      const Status st = pool_->exec_->StartPiped(job->t.get(), job->pull, item);
      if (st == LLM_SUCCESS) {
        item->tag = job.release();
        return true;
      }
      Complete(std::move(*job), st);  // failed before anything moved
    }
  }

  void Done(const PipeItem &item, Status st) override {
    std::unique_ptr<AsyncPool::Job> job(static_cast<AsyncPool::Job *>(item.tag));
    const Status end = pool_->exec_->FinishPiped(job->t.get(), job->pull, st);
    Complete(std::move(*job), end);
  }

  // Ends the run's membership in piping_ if Next has not already (the run stopped early).
  ~PoolFeed() {
    std::lock_guard<std::mutex> g(pool_->mu_);
    Leave();
  }

 private:
  void Complete(AsyncPool::Job job, Status st) {
    // The running path belongs to the link, which the last transfer may be the last to hold.
    if (!link_) link_ = job.t->link;
    pool_->exec_->Tally(job.t.get(), st);
    job.t.reset();  // releases the engine, cache and link locks before anyone is woken
    job.s->Complete(st, LastErrorMessage());
    ClearLastError();
  }
  void Join() {
    if (!joined_) pool_->piping_.push_back(key_);
    joined_ = true;
  }
  void Leave() {
    if (!joined_) return;
    auto &v = pool_->piping_;
    v.erase(std::find(v.begin(), v.end(), key_));
    joined_ = false;
  }

  std::shared_ptr<void> link_;  // declared first: released last, after the path has returned
  AsyncPool *const pool_;
  const void *const key_;
  AsyncPool::Job first_;
  PipeItem first_item_;
  bool ready_ = false;
  bool joined_ = true;  // Loop put the first job's key in piping_
};

void AsyncPool::Run(Job job) {
  if (job.key == nullptr) {
    RunDetached(*exec_, std::move(job.t), job.pull, job.s);
    return;
  }
  PoolFeed feed(this, std::move(job));
  feed.Run();
}

namespace {
void RunDetached(Executor &exec, TransferPtr t, bool pull, const std::shared_ptr<TransferState> &s) {
  ClearLastError();
  Status st;
  try {
    st = exec.RunDetached(t.get(), pull);
  } catch (const std::bad_alloc &) {
    st = Fail(LLM_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    st = Fail(LLM_FAILED, "internal error: %s", e.what());
  } catch (...) {
    st = Fail(LLM_FAILED, "internal error");
  }
  exec.Tally(t.get(), st);
  t.reset();  // releases the engine, cache and link locks before anyone is woken
  s->Complete(st, LastErrorMessage());
}
}  // namespace

Async::~Async() = default;

std::shared_ptr<AsyncPool> Async::Pool() {
  std::lock_guard<std::mutex> g(mu_);
  if (!pool_) pool_ = std::make_shared<AsyncPool>(exec_);
  return pool_;
}

void Async::Post(AsyncPool &pool, TransferPtr t, bool pull, TransferHandle *out) {
  auto s = std::make_shared<TransferState>();
  *out = TransferHandle(s);
  const void *key = Executor::PipelineKey(t.get(), pull);
  const bool brief = key == nullptr && Executor::BriefCopy(t.get());
  AsyncPool::Job job{std::move(t), pull, s, key, brief};
  if (!pool.Post(job)) RunDetached(*exec_, std::move(job.t), job.pull, s);
}

Status Async::SubmitBlocks(const BlocksRequest *reqs, size_t n, TransferHandle *out, size_t *failed) {
  std::vector<TransferPtr> prepared;
  prepared.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TransferPtr t = NewTransfer();
    t->kind = reqs[i].pull ? metrics::kPullBlocksAsync : metrics::kPushBlocksAsync;
    const BlocksRequest &r = reqs[i];
    const Status st = checks_->Blocks(t.get(), r.pull, r.remote, r.local, r.src_blocks, r.dst_blocks, r.ext);
    if (st != LLM_SUCCESS) {
      *failed = i;
      return exec_->Tally(t.get(), st);  // `prepared` holds no lock: nothing was submitted
    }
    Executor::Detach(t.get());
    prepared.push_back(std::move(t));
  }
  const std::shared_ptr<AsyncPool> pool = Pool();
  for (size_t i = 0; i < n; ++i) Post(*pool, std::move(prepared[i]), reqs[i].pull, &out[i]);
  return LLM_SUCCESS;
}

Status Async::SubmitOne(bool pull, const CacheIndex &remote, const Cache &local, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext, TransferHandle *out) {
  TransferPtr t = NewTransfer();
  t->kind = pull ? metrics::kPullBlocksAsync : metrics::kPushBlocksAsync;
  Status st = checks_->Blocks(t.get(), pull, remote, local, src_blocks, dst_blocks, ext);
  if (st != LLM_SUCCESS) return exec_->Tally(t.get(), st);
  if (Executor::InlineCopy(t.get())) {
    // A copy this small costs less than handing it to a worker (a futex wake-up and a switch):
    // it runs here, with the locks the checks took, and the handle is returned done.
    st = exec_->Tally(t.get(), exec_->Run(t.get(), pull));
    t.reset();
    auto s = std::make_shared<TransferState>();
    s->Complete(st, LastErrorMessage());
    *out = TransferHandle(std::move(s));
    ClearLastError();
    return LLM_SUCCESS;
  }
  Executor::Detach(t.get());
  Post(*Pool(), std::move(t), pull, out);
  return LLM_SUCCESS;
}

// A transfer prepared and detached elsewhere (ranges.cc, prepared.cc), run like a submitted blocks
// transfer.
void Async::Submit(TransferPtr t, bool pull, TransferHandle *out) {
  auto s = std::make_shared<TransferState>();
  *out = TransferHandle(s);
  // Its plans (t->rest too) run in order on one worker: never in a pipelined run.
  AsyncPool::Job job{std::move(t), pull, s, nullptr, false};
  if (!Pool()->Post(job)) RunDetached(*exec_, std::move(job.t), job.pull, s);
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
