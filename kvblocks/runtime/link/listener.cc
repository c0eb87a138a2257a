// SPDX-License-Identifier: Apache-2.0
// The listener (link/listener.h): accept loop, pre-authentication slots, loose sockets.
#include "link/listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/limits.h"
#include "common/util.h"
#include "net/socket.h"
#include "wire/messages.h"

namespace kvblocks {

using llm_datadist::LLM_FAILED;
using llm_datadist::LLM_SUCCESS;
using llm_datadist::Status;

Status Listener::Start(const std::string &ip, uint32_t port) {
  if (stopping_->load()) return LLM_FAILED;
  Status st;
  const int fd = ListenTcp(ip, port, &st);
  if (fd < 0) return st;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  uint16_t bound = static_cast<uint16_t>(port);  // port 0: the kernel's choice, read back
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0)
    bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
  {
    std::lock_guard<std::mutex> g(mu_);  // Address reads them from any thread
    fd_ = fd;
    ip_ = ip;
    port_ = port;
    bound_port_ = bound;
  }
  if (!host_->Spawn([this, fd] { Loop(fd); })) {
    close(fd);
    std::lock_guard<std::mutex> g(mu_);
    fd_ = -1;
    return LLM_FAILED;
  }
  return LLM_SUCCESS;
}

void Listener::Stop() {
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ >= 0) {
    // The loop's thread owns and closes the fd; shutdown() wakes its poll().
    shutdown(fd_, SHUT_RDWR);
    fd_ = -1;
  }
}

bool Listener::ListeningOn(const std::string &ip, uint32_t port) {
  std::lock_guard<std::mutex> g(mu_);
  return fd_ >= 0 && ip == ip_ && port == port_;
}

std::string Listener::Address() {
  std::lock_guard<std::mutex> g(mu_);
  if (fd_ < 0) return "";
  const bool v6 = ip_.find(':') != std::string::npos;
  return (v6 ? "[" + ip_ + "]" : ip_) + ":" + std::to_string(bound_port_);
}

void Listener::TrackLoose(int fd) {
  std::lock_guard<std::mutex> g(mu_);
  loose_.insert(fd);
}

void Listener::ForgetLoose(int fd) {
  std::lock_guard<std::mutex> g(mu_);
  loose_.erase(fd);
}

void Listener::WakeLoose() {
  std::lock_guard<std::mutex> g(mu_);
  for (int fd : loose_) shutdown(fd, SHUT_RDWR);
}

bool Listener::LeavePreauth(int fd) {
  std::lock_guard<std::mutex> g(mu_);
  return preauth_.erase(fd) != 0;
}

void Listener::Loop(int lfd) {
  std::vector<pollfd> p;
  for (;;) {
    p.assign(1, pollfd{lfd, POLLIN, 0});
    int64_t expiry = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (fd_ != lfd) break;
      for (const auto &kv : preauth_) {
        if (kv.second.threaded) continue;
        p.push_back(pollfd{kv.first, POLLIN, 0});
        if (expiry == 0 || kv.second.since + kAuthNs < expiry) expiry = kv.second.since + kAuthNs;
      }
    }
    const int timeout = expiry == 0 ? -1 : static_cast<int>(std::max<int64_t>(0, expiry - NowNs()) / kMsNs + 1);
    const int rc = poll(p.data(), p.size(), timeout);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 || (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) || stopping_->load()) break;
    // In this order: nothing below closes an fd that a later step of this round still names.
    for (size_t i = 1; i < p.size(); ++i)
      if (p[i].revents != 0) StartHandshake(p[i].fd);
    Expire(false);
    if (p[0].revents & POLLIN) AcceptBatch(lfd);
  }
  Expire(true);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (fd_ == lfd) fd_ = -1;
  }
  close(lfd);
}

void Listener::AcceptBatch(int lfd) {
  for (size_t i = 0; i < 4 * kMaxHandshakes; ++i) {  // then poll again: the waiting ones may be ready
    const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) usleep(10000);
      return;
    }
    TuneSocket(fd);
    // poll() says readable only once the whole HELLO frame is here (or the peer closed).
    const int hello = static_cast<int>(kFrameHeaderBytes + kHelloBytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &hello, sizeof(hello));
    std::lock_guard<std::mutex> g(mu_);
    Admit(fd);
  }
}

void Listener::Admit(int fd) {
  // When every slot is taken the oldest goes (a real handshake takes milliseconds), never the new
  // connection; an opener whose handshake was dropped connects again (Linker::OpenHandshake).
  if (preauth_.size() >= kMaxHandshakes) {
    auto oldest = preauth_.begin();
    for (auto it = preauth_.begin(); it != preauth_.end(); ++it)
      if (it->second.since < oldest->second.since) oldest = it;
    if (NowNs() - logged_ > kSecNs) {  // a flood logs once a second, not once a socket
      LogWarn("%zu handshakes in progress: dropping the oldest", preauth_.size());
      logged_ = NowNs();
    }
    if (oldest->second.threaded) {
      shutdown(oldest->first, SHUT_RDWR);  // its thread closes it
    } else {
      loose_.erase(oldest->first);
      close(oldest->first);
    }
    preauth_.erase(oldest);
  }
  loose_.insert(fd);
  preauth_[fd] = Preauth{NowNs(), false};
  if (stopping_->load()) shutdown(fd, SHUT_RDWR);
}

void Listener::StartHandshake(int fd) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = preauth_.find(fd);
    if (it == preauth_.end() || it->second.threaded) return;
    it->second.threaded = true;
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));  // later frames may be shorter
  if (!host_->Spawn([this, fd] { host_->Handshake(fd); })) {
    std::lock_guard<std::mutex> g(mu_);
    loose_.erase(fd);
    preauth_.erase(fd);
    close(fd);
  }
}

void Listener::Expire(bool all) {
  std::lock_guard<std::mutex> g(mu_);
  const int64_t now = NowNs();
  for (auto it = preauth_.begin(); it != preauth_.end();) {
    if (!it->second.threaded && (all || now - it->second.since >= kAuthNs)) {
      loose_.erase(it->first);
      close(it->first);
      it = preauth_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace kvblocks
