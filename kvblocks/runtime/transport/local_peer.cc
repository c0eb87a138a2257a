// SPDX-License-Identifier: Apache-2.0
#include "transport/local_peer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/limits.h"
#include "common/util.h"
#include "security/auth.h"
#include "transport/beacon.h"
#include "wire/codec.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace kvblocks {

namespace {

sockaddr_un Address(const std::string &name, socklen_t *len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';  // abstract namespace: no file, gone with the socket
  memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

bool WaitFd(int fd, short events, int64_t deadline) {
  for (;;) {
    const int64_t left = deadline - NowNs();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(left / kMsNs) + 1);
    if (rc > 0) return (p.revents & events) != 0 || (p.revents & (POLLHUP | POLLERR)) != 0;
    if (rc < 0 && errno != EINTR) return false;
  }
}

// Key, control-connection ends, count: the fixed part of a message after its length.
constexpr uint32_t kFixedBytes = 16 + 2 * 18 + 4;

// One message: u32 length, then key[16], the sender's control-connection ends (local[18],
// remote[18]), count u32, cache ids i64; the memfds ride on it.
bool Send(int fd, const uint8_t key[16], const ConnEnds &ctrl, const LocalFds &fds, int64_t deadline) {
  if (fds.size() > kMaxLocalFds) return false;
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(kFixedBytes + 8 * fds.size()));
  w.PutBytes(key, 16);
  w.PutBytes(ctrl.local, sizeof(ctrl.local));
  w.PutBytes(ctrl.remote, sizeof(ctrl.remote));
  w.Put<uint32_t>(static_cast<uint32_t>(fds.size()));
  for (const auto &f : fds) w.Put<int64_t>(f.first);
  std::vector<char> ctl(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())));
  iovec iov{&w.buf[0], w.buf.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (!fds.empty()) {
    m.msg_control = ctl.data();
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    int *out = reinterpret_cast<int *>(CMSG_DATA(c));
    for (size_t i = 0; i < fds.size(); ++i) out[i] = fds[i].second;
  }
  size_t sent = 0;
  while (sent < w.buf.size()) {
    if (!WaitFd(fd, POLLOUT, deadline)) return false;
    iov.iov_base = &w.buf[sent];
    iov.iov_len = w.buf.size() - sent;
    const ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
    m.msg_control = nullptr;  // the fds went with the first byte
    m.msg_controllen = 0;
  }
  return true;
}

bool Recv(int fd, uint8_t key[16], ConnEnds *ends, LocalPeer *out, int64_t deadline) {
  constexpr size_t kMax = 4 + kFixedBytes + 8 * kMaxLocalFds;
  std::string buf;
  std::vector<int> got;
  std::vector<char> ctl(CMSG_SPACE(sizeof(int) * kMaxLocalFds));
  bool ok = true;
  size_t want = 4;
  while (ok && buf.size() < want) {
    if (!WaitFd(fd, POLLIN, deadline)) {
      ok = false;
      break;
    }
    char chunk[kMax];
    iovec iov{chunk, want - buf.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.data();
    m.msg_controllen = ctl.size();
    const ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    for (cmsghdr *c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int *in = reinterpret_cast<const int *>(CMSG_DATA(c));
      for (size_t i = 0; i < k; ++i) got.push_back(in[i]);
    }
    if (n <= 0 || (m.msg_flags & MSG_CTRUNC) != 0) {
      ok = false;
      break;
    }
    buf.append(chunk, static_cast<size_t>(n));
    if (want == 4 && buf.size() == 4) {
      Reader r(buf);
      const uint32_t len = r.Get<uint32_t>();
      if (len < kFixedBytes || len > kMax - 4) ok = false;  // an older peer's message is shorter
      want = 4 + len;
    }
  }
  Reader r(buf);
  r.Get<uint32_t>();
  r.GetBytes(key, 16);
  r.GetBytes(ends->local, sizeof(ends->local));
  r.GetBytes(ends->remote, sizeof(ends->remote));
  const uint32_t count = r.Get<uint32_t>();
  ok = ok && r.ok && count == got.size() && r.left() == uint64_t{count} * 8;
  for (size_t i = 0; ok && i < count; ++i) {
    const int64_t id = r.Get<int64_t>();
    if (out->memfds.count(id) != 0) {
      ok = false;
      break;
    }
    out->memfds[id] = got[i];
    got[i] = -1;
  }
  for (int f : got)
    if (f >= 0) close(f);
  if (!ok) out->Release();
  return ok;
}

// The kernel's word on who is at the other end, pinned with a pidfd; never this process.
bool Learn(int fd, LocalPeer *out) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0 || cred.pid == getpid())
    return false;
  out->pid = cred.pid;
  out->pidfd = OpenPidfd(cred.pid);
  return true;
}

// The peer's control-connection ends must mirror ours: else it is not the process at the far end of
// our control connection (a relaying peer handed it this link's name and key).
bool SameConnection(const ConnEnds &theirs, const ConnEnds &mine, const LocalPeer &peer) {
  if (MirrorsOf(theirs, mine)) return true;
  LogWarn("same-host exchange refused: process %d is not at the far end of this link's control connection "
          "(a relaying peer?); the link stays on the served path", peer.pid);
  return false;
}

// `sa` as 16 address bytes (IPv4 mapped) and a big-endian port; false for other families.
bool PutEnd(const sockaddr_storage &sa, uint8_t out[18]) {
  memset(out, 0, 18);
  if (sa.ss_family == AF_INET) {
    const auto *a = reinterpret_cast<const sockaddr_in *>(&sa);
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &a->sin_addr, 4);
    memcpy(out + 16, &a->sin_port, 2);
    return true;
  }
  if (sa.ss_family == AF_INET6) {
    const auto *a = reinterpret_cast<const sockaddr_in6 *>(&sa);
    memcpy(out, &a->sin6_addr, 16);
    memcpy(out + 16, &a->sin6_port, 2);
    return true;
  }
  return false;
}

}  // namespace

bool ConnEndsOf(int fd, ConnEnds *out) {
  sockaddr_storage l{}, r{};
  socklen_t ll = sizeof(l), rl = sizeof(r);
  return getsockname(fd, reinterpret_cast<sockaddr *>(&l), &ll) == 0 &&
         getpeername(fd, reinterpret_cast<sockaddr *>(&r), &rl) == 0 && PutEnd(l, out->local) &&
         PutEnd(r, out->remote);
}

bool MirrorsOf(const ConnEnds &theirs, const ConnEnds &mine) {
  return memcmp(theirs.local, mine.remote, sizeof(mine.remote)) == 0 &&
         memcmp(theirs.remote, mine.local, sizeof(mine.local)) == 0;
}

LocalPeer::LocalPeer() = default;
LocalPeer::~LocalPeer() = default;
LocalPeer::LocalPeer(LocalPeer &&) noexcept = default;
LocalPeer &LocalPeer::operator=(LocalPeer &&) noexcept = default;

void LocalPeer::TakeBeacon() {
  auto it = memfds.find(kBeaconId);
  if (it == memfds.end()) return;
  const int fd = it->second;
  memfds.erase(it);
  if (fd >= 0) beacon = PeerBeacon::Map(fd);
}

void LocalPeer::Release() {
  for (auto &kv : memfds)
    if (kv.second >= 0) close(kv.second);
  memfds.clear();
}

int ListenLocal(std::string *name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  uint8_t rnd[12];
  RandomBytes(rnd, sizeof(rnd));
  char hex[sizeof(rnd) * 2 + 1];
  for (size_t i = 0; i < sizeof(rnd); ++i) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  *name = std::string("kvblocks-") + hex;
  socklen_t len;
  sockaddr_un a = Address(*name, &len);
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool AcceptLocalExchange(int lfd, const uint8_t my_key[16], const uint8_t their_key[16], const ConnEnds &ctrl,
                         const LocalFds &mine, int64_t deadline, LocalPeer *out) {
  if (!WaitFd(lfd, POLLIN, deadline)) return false;
  const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return false;
  uint8_t key[16];
  ConnEnds ends;
  LocalPeer peer;
  // Nothing of ours (key, memfds) goes out before the opener proved both the key and the connection.
  bool ok = Recv(fd, key, &ends, &peer, deadline) && ConstantTimeEqual(key, my_key, 16) && Learn(fd, &peer) &&
            SameConnection(ends, ctrl, peer) && Send(fd, their_key, ctrl, mine, deadline);
  close(fd);
  if (!ok) {
    peer.Release();
    if (peer.pidfd >= 0) close(peer.pidfd);
    return false;
  }
  *out = std::move(peer);
  return true;
}

int ConnectLocal(const std::string &name) {
  if (name.empty() || name.size() > kMaxLocalName) return -1;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  socklen_t len;
  sockaddr_un a = Address(name, &len);
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool OpenerLocalExchange(int fd, const uint8_t my_key[16], const uint8_t their_key[16], const ConnEnds &ctrl,
                         const LocalFds &mine, int64_t deadline, LocalPeer *out) {
  uint8_t key[16];
  ConnEnds ends;
  LocalPeer peer;
  const bool ok = Learn(fd, &peer) && Send(fd, their_key, ctrl, mine, deadline) &&
                  Recv(fd, key, &ends, &peer, deadline) && ConstantTimeEqual(key, my_key, 16) &&
                  SameConnection(ends, ctrl, peer);
  if (!ok) {
    peer.Release();
    if (peer.pidfd >= 0) close(peer.pidfd);
    return false;
  }
  *out = std::move(peer);
  return true;
}

int OpenPidfd(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool ProcessExited(int pidfd) {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace kvblocks
