// SPDX-License-Identifier: Apache-2.0
// Link bookkeeping: sockets, the late caches and failure.
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
  {
    std::lock_guard<std::mutex> g(mu);
    for (int fd : fds) shutdown(fd, SHUT_RDWR);
    cv.notify_all();
  }
  for (const Attached &a : attached)  // set before the link is used, never changed after
    if (a.state) a.state->OnShutdown();
}

void Link::Fail() {
  if (alive.exchange(false) && registered.load() && stats) CountEnd();
  Shutdown();
  for (const Attached &a : attached)
    if (a.state) a.state->OnFail();
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
