// SPDX-License-Identifier: Apache-2.0
// The served backend's channel pool (channels.h), moved here from the link.
#include "transport/tcp/channels.h"

#include <algorithm>
#include <chrono>

#include "common/limits.h"
#include "common/util.h"
#include "transport/peer.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

int TcpChannels::Acquire(int64_t deadline, Status *st) {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    if (!link_->alive.load()) {
      *st = LLM_NOT_YET_LINK;
      return -1;
    }
    if (!idle_.empty()) {
      const int fd = idle_.back();
      idle_.pop_back();
      return fd;
    }
    if (link_->opener && held_ < kMaxRequesterChannels) {
      ++held_;
      g.unlock();
      const int fd = link_->OpenChannel(ConnKind::kDataFwd, deadline, st);
      g.lock();
      if (fd < 0) {
        --held_;
        if (*st != LLM_TIMEOUT) *st = LLM_LINK_FAILED;
      }
      return fd;
    }
    const int64_t since_refusal = NowNs() - reverse_refused_at_;
    if (!link_->opener && held_ + pending_reverse_ < kMaxRequesterChannels && since_refusal >= kReverseRetryNs) {
      // Only the opener can connect; ask it for another reverse channel over the control link.
      ++pending_reverse_;
      g.unlock();
      link_->SendCtrl(kOpenReverse, deadline);
      g.lock();
    }
    int64_t left = deadline - NowNs();
    if (left <= 0) {
      *st = LLM_TIMEOUT;
      return -1;
    }
    if (!link_->opener && since_refusal < kReverseRetryNs) left = std::min(left, kReverseRetryNs - since_refusal);
    cv_.wait_for(g, std::chrono::nanoseconds(left));
  }
}

void TcpChannels::Refused() {
  std::lock_guard<std::mutex> g(mu_);
  if (pending_reverse_ > 0) --pending_reverse_;
  reverse_refused_at_ = NowNs();
  cv_.notify_all();
}

void TcpChannels::Release(int fd, bool reusable) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (reusable && link_->alive.load()) {
      idle_.push_back(fd);
      cv_.notify_one();
      return;
    }
    --held_;
  }
  link_->ForgetFd(fd);
}

bool TcpChannels::Reserve() {
  std::lock_guard<std::mutex> g(mu_);
  if (held_ >= kMaxRequesterChannels) return false;
  ++held_;  // taken under the same lock as the check: concurrent accepts cannot overshoot
  return true;
}

void TcpChannels::Unreserve() {
  std::lock_guard<std::mutex> g(mu_);
  --held_;
}

void TcpChannels::Add(int fd) {
  std::lock_guard<std::mutex> g(mu_);
  idle_.push_back(fd);  // its slot was taken by Reserve
  if (pending_reverse_ > 0) --pending_reverse_;
  cv_.notify_all();
}

int TcpChannels::count() {
  std::lock_guard<std::mutex> g(mu_);
  return held_;
}

void TcpChannels::OnShutdown() {
  std::lock_guard<std::mutex> g(mu_);
  cv_.notify_all();
}

void TcpChannels::OnFail() {
  std::vector<int> closing;
  {
    std::lock_guard<std::mutex> g(mu_);
    closing.swap(idle_);
    held_ -= static_cast<int>(closing.size());
  }
  for (int fd : closing) link_->ForgetFd(fd);
}

}  // namespace kvblocks
