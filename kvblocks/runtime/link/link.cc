// SPDX-License-Identifier: Apache-2.0
// Link bookkeeping: sockets, the channel pool and failure.
#include "link/link.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/limits.h"
#include "common/util.h"
#include "net/socket.h"
#include "net/tls.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

void Link::AddFd(int fd) {
  std::lock_guard<std::mutex> g(mu);
  fds.insert(fd);
  if (!alive.load()) shutdown(fd, SHUT_RDWR);
}

void Link::ForgetFd(int fd) {
  std::lock_guard<std::mutex> g(mu);
  if (fds.erase(fd) != 0) CloseConn(fd);
}

void Link::Shutdown() {
  std::lock_guard<std::mutex> g(mu);
  for (int fd : fds) shutdown(fd, SHUT_RDWR);
  cv.notify_all();
}

void Link::Fail() {
  if (alive.exchange(false) && registered.load() && stats) CountEnd();
  Shutdown();
  std::vector<int> closing;
  {
    std::lock_guard<std::mutex> g(mu);
    closing.swap(idle);
    requester_channels -= static_cast<int>(closing.size());
  }
  for (int fd : closing) ForgetFd(fd);
}

// A link that was up ends: an unlink when one was acknowledged, else a break.
void Link::CountEnd() {
  bool unlinked;
  {
    std::lock_guard<std::mutex> g(mu);
    unlinked = unlink_acked;
  }
  metrics::Add(unlinked ? stats->unlinks : stats->link_breaks);
}

bool Link::SendCtrl(uint16_t type, int64_t deadline, const std::string &payload) {
  std::lock_guard<std::mutex> g(ctrl_write_mu);
  return ctrl_fd >= 0 && SendFrame(ctrl_fd, type, 0, payload, deadline) == IoResult::kOk;
}

bool Link::CtrlClosedByPeer() {
  std::lock_guard<std::mutex> g(ctrl_write_mu);
  if (ctrl_fd < 0) return false;  // closed by us: Fail() came first
  pollfd p{ctrl_fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void Link::CloseCtrl() {
  int fd;
  {
    std::lock_guard<std::mutex> g(ctrl_write_mu);
    fd = ctrl_fd;
    ctrl_fd = -1;
  }
  if (fd >= 0) ForgetFd(fd);
}

Link::~Link() {
  local.Release();
  if (local.pidfd >= 0) close(local.pidfd);
  for (int fd : fds) CloseConn(fd);  // channels left behind by a failed link or a late reverse channel
}

int Link::AcquireChannel(int64_t deadline, Status *st) {
  std::unique_lock<std::mutex> g(mu);
  for (;;) {
    if (!alive.load()) {
      *st = LLM_NOT_YET_LINK;
      return -1;
    }
    if (!idle.empty()) {
      const int fd = idle.back();
      idle.pop_back();
      return fd;
    }
    if (opener && requester_channels < kMaxRequesterChannels) {
      ++requester_channels;
      g.unlock();
      const int fd = open_channel(ConnKind::kDataFwd, deadline, st);
      g.lock();
      if (fd < 0) {
        --requester_channels;
        if (*st != LLM_TIMEOUT) *st = LLM_LINK_FAILED;
      }
      return fd;
    }
    const int64_t since_refusal = NowNs() - reverse_refused_at;
    if (!opener && requester_channels + pending_reverse < kMaxRequesterChannels && since_refusal >= kReverseRetryNs) {
      // Only the opener can connect; ask it for another reverse channel over the control link.
      ++pending_reverse;
      g.unlock();
      SendCtrl(kOpenReverse, deadline);
      g.lock();
    }
    int64_t left = deadline - NowNs();
    if (left <= 0) {
      *st = LLM_TIMEOUT;
      return -1;
    }
    if (!opener && since_refusal < kReverseRetryNs) left = std::min(left, kReverseRetryNs - since_refusal);
    cv.wait_for(g, std::chrono::nanoseconds(left));
  }
}

void Link::ReverseRefused() {
  std::lock_guard<std::mutex> g(mu);
  if (pending_reverse > 0) --pending_reverse;
  reverse_refused_at = NowNs();
  cv.notify_all();
}

void Link::ReleaseChannel(int fd, bool reusable) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (reusable && alive.load()) {
      idle.push_back(fd);
      cv.notify_one();
      return;
    }
    --requester_channels;
  }
  ForgetFd(fd);
}

void Link::AddRequesterChannel(int fd) {
  std::lock_guard<std::mutex> g(mu);
  idle.push_back(fd);  // its slot in requester_channels was taken when it was accepted
  if (pending_reverse > 0) --pending_reverse;
  cv.notify_all();
}

std::shared_ptr<RemoteCache> Link::FindCache(int64_t id) {
  auto it = caches.find(id);
  if (it != caches.end()) return std::shared_ptr<RemoteCache>(std::shared_ptr<void>(), &it->second);
  std::shared_lock<std::shared_mutex> g(late_mu);
  auto lt = late.find(id);
  return lt == late.end() ? nullptr : lt->second;
}

void Link::AddLate(std::shared_ptr<RemoteCache> rc) {
  std::unique_lock<std::shared_mutex> g(late_mu);
  const int64_t id = rc->id;
  const uint64_t bytes = TableFootprint(*rc);
  auto it = late.find(id);
  if (it != late.end()) {
    late_bytes -= TableFootprint(*it->second);
    late_bytes += bytes;
    it->second = std::move(rc);  // a fresher answer (keys bound since); transfers keep the old one
  } else {
    late.emplace(id, std::move(rc));
    late_order.push_back(id);
    late_bytes += bytes;
  }
  // Over either budget: forget the oldest others (never the one just added).
  while ((late.size() > kMaxLateCaches || late_bytes > kMaxLinkTableBytes) && late_order.front() != id) {
    auto old = late.find(late_order.front());
    late_bytes -= TableFootprint(*old->second);
    late.erase(old);
    late_order.pop_front();
  }
}

std::shared_ptr<RemoteCache> Link::ForgetLate(int64_t id) {
  std::unique_lock<std::shared_mutex> g(late_mu);
  auto it = late.find(id);
  if (it == late.end()) return nullptr;
  std::shared_ptr<RemoteCache> rc = std::move(it->second);
  late_bytes -= TableFootprint(*rc);
  late.erase(it);
  late_order.erase(std::find(late_order.begin(), late_order.end(), id));
  return rc;
}

bool Link::Shown(int64_t id) {
  if (shown.count(id) != 0) return true;
  std::shared_lock<std::shared_mutex> g(late_mu);
  return late_shown.count(id) != 0;
}

std::string Link::PathName() const { return DescribePaths(*this); }

}  // namespace kvblocks
