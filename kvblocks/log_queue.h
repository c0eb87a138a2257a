// SPDX-License-Identifier: Apache-2.0
// The Python package's log sink (kvblocks::SetLogCallback): the runtime's threads push records here
// and return at once; a Python daemon thread (and each API call, as it returns) moves them into
// logging.getLogger("kvblocks"). A runtime thread never waits for the GIL, so it can never
// deadlock with a Python thread that waits, GIL released, for a runtime lock.
#ifndef KVBLOCKS_LOG_QUEUE_H_
#define KVBLOCKS_LOG_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

namespace kvblocks {

class LogQueue {
 public:
  static constexpr size_t kMaxRecords = 1024;  // a flood beyond this is counted, not kept

  // The callback: takes the record, or counts it as dropped when kMaxRecords wait already.
  static void Push(void *self, int level, const char *message) noexcept {
    auto *q = static_cast<LogQueue *>(self);
    try {
      std::lock_guard<std::mutex> g(q->mu_);
      if (q->records_.size() >= kMaxRecords) {
        ++q->dropped_;
        return;
      }
      q->records_.emplace_back(level, message);
    } catch (...) {  // out of memory: lose the line, never the thread
      return;
    }
    q->cv_.notify_one();
  }

  // Waits up to `wait_ms` for a record (or a count of dropped ones); true when one waits. It takes
  // nothing: records leave the queue only through Pop, called with the GIL held, so a record is never
  // in the hands of a thread that the interpreter's exit freezes before it logs it (the exit drain
  // would miss it: a pump that popped and then waited for the GIL lost the line under load).
  bool Wait(int64_t wait_ms) noexcept {
    std::unique_lock<std::mutex> g(mu_);
    return cv_.wait_for(g, std::chrono::milliseconds(wait_ms), [this] { return !records_.empty() || dropped_ != 0; });
  }

  // The oldest record, at once; false when none waits. A count of dropped records comes first, once
  // per flood, as a warning (level 1).
  bool Pop(int *level, std::string *message) noexcept {
    std::lock_guard<std::mutex> g(mu_);
    if (dropped_ != 0) {
      *level = 1;
      *message = std::to_string(dropped_) + " kvblocks log records were dropped: more than " +
                 std::to_string(kMaxRecords) + " waited to reach Python logging";
      dropped_ = 0;
      return true;
    }
    if (records_.empty()) return false;
    *level = records_.front().first;
    message->swap(records_.front().second);
    records_.pop_front();
    return true;
  }

  // In a child after fork(): the parent's lock may have been held by a thread that is gone.
  void ResetAfterFork() noexcept {
    new (&mu_) std::mutex();
    new (&cv_) std::condition_variable();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::string>> records_;
  uint64_t dropped_ = 0;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_LOG_QUEUE_H_
