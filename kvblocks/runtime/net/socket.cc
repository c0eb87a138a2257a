// SPDX-License-Identifier: Apache-2.0
// Non-blocking socket I/O with deadlines. Every wait is a poll() bounded by the caller's deadline,
// so no transfer can hang on a frozen peer.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "net/socket.h"

namespace kvblocks {

using llm_datadist::Status;
using namespace llm_datadist;  // NOLINT: status constants

namespace {

int64_t SpinNs() {
  static const int64_t ns = [] {
    const char *v = getenv("KVBLOCKS_SPIN_US");
    return (v != nullptr ? atoll(v) : kDefaultSpinUs) * 1000LL;
  }();
  return ns;
}

thread_local bool t_no_spin = false;
thread_local int64_t t_spin_off_until = 0;  // this thread saw the machine busy: no spin until then
thread_local int64_t t_spin_backoff = 0;    // the current back-off; 0 after an unpreempted spin

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Polls without sleeping until `until`; true when the fd is ready. A spin that got less than half
// of its wall time on the CPU was preempted: either the cores are busy with other work, where a
// spinner only delays the thread it waits for (and loses the scheduler's favour for woken
// sleepers), or the peer thread was just woken onto this core. This thread then waits in poll()
// without spinning for a back-off that starts at kSpinBackoffMinNs and doubles with each further
// preempted spin up to kSpinBackoffNs; a spin that finds the fd ready unpreempted resets it. A single
// preempted spin used to cost the full back-off: on two idle cores, wake-ups that place the peer on
// this core then kept small transfers sleeping (paying a wake-up each) most of the time.
// Between polls the spinner yields: when the peer thread shares its core (loopback), it then runs at
// once instead of after the spin.
bool SpinPoll(int fd, short events, int64_t until, short *revents) {
  const int64_t wall0 = NowNs(), cpu0 = ThreadCpuNs();
  bool ready = false;
  do {
    pollfd p{fd, events, 0};
    if (poll(&p, 1, 0) > 0) {
      *revents = p.revents;
      ready = true;
      break;
    }
    sched_yield();  // the thread we wait for may be queued on this very core
  } while (NowNs() < until);
  const int64_t wall = NowNs() - wall0;
  if (wall > 20000 && 2 * (ThreadCpuNs() - cpu0) < wall) {
    t_spin_backoff = t_spin_backoff == 0 ? kSpinBackoffMinNs : std::min<int64_t>(2 * t_spin_backoff, kSpinBackoffNs);
    t_spin_off_until = NowNs() + t_spin_backoff;
  } else if (ready) {
    t_spin_backoff = 0;
  }
  return ready;
}

// Waits for `events`; returns false on timeout. Deadline 0 waits forever (only serving threads,
// which are woken by shutdown()).
IoResult WaitFd(int fd, short events, int64_t deadline) {
  // Poll without sleeping for a short while first. A thread that sleeps must be woken by another
  // CPU, and on virtual machines that wake-up (an inter-processor interrupt through the
  // hypervisor) costs tens of microseconds: more than a small transfer. KVBLOCKS_SPIN_US sets it.
  // Only reads spin: a writer waiting for buffer space would steal the CPU its reader needs.
  const int64_t spin = events == POLLIN && !t_no_spin ? SpinNs() : 0;
  if (spin > 0 && NowNs() >= t_spin_off_until) {
    const int64_t until = deadline != 0 ? std::min<int64_t>(NowNs() + spin, deadline) : NowNs() + spin;
    short revents = 0;
    if (SpinPoll(fd, events, until, &revents)) return (revents & POLLNVAL) ? IoResult::kError : IoResult::kOk;
  }
  for (;;) {
    int timeout_ms = -1;
    if (deadline != 0) {
      const int64_t left = deadline - NowNs();
      if (left <= 0) return IoResult::kTimeout;
      timeout_ms = static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, timeout_ms);
    if (rc > 0) {
      if (p.revents & POLLNVAL) return IoResult::kError;
      return IoResult::kOk;  // POLLHUP / POLLERR surface through the next read or write
    }
    if (rc == 0) continue;  // re-check the deadline
    if (errno != EINTR) return IoResult::kError;
  }
}

// Consumes n transferred bytes from the front of iov[*first..iovcnt).
void Advance(struct iovec *iov, size_t iovcnt, size_t *first, size_t n) {
  while (n > 0 && *first < iovcnt) {
    iovec &v = iov[*first];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++*first;
    } else {
      v.iov_base = static_cast<uint8_t *>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
}

IoResult Classify(int err) {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ESHUTDOWN) return IoResult::kClosed;
  return IoResult::kError;
}


// SO_RCVLOWAT for one large receive: never above the bytes still to come (poll would then sleep
// to the deadline), and back to 1 when the receive ends, for the small frames that follow.
class RecvLowat {
 public:
  RecvLowat(int fd, const iovec *iov, size_t iovcnt) : fd_(fd) {
    for (size_t i = 0; i < iovcnt; ++i) left_ += iov[i].iov_len;
    if (left_ >= kLowatMinBytes) Set(kRecvLowatBytes);
  }
  ~RecvLowat() {
    if (cur_ > 1) Set(1);
  }
  void Moved(size_t n) { left_ -= std::min<uint64_t>(n, left_); }
  // Before a wait: the mark must not exceed what the peer will still send.
  void Fit() {
    if (cur_ > 1 && left_ < cur_) Set(std::max<uint64_t>(left_, 1));
  }

 private:
  void Set(uint64_t v) {
    const int x = static_cast<int>(v);
    if (setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &x, sizeof(x)) == 0) cur_ = v;
  }
  int fd_;
  uint64_t left_ = 0, cur_ = 1;
};

// Moves iov[0..iovcnt) with sendmsg/recvmsg, waiting on EAGAIN until the deadline.
IoResult MoveIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline, bool send) {
  size_t first = 0;
  RecvLowat lowat(fd, iov, send ? 0 : iovcnt);
  while (first < iovcnt) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    // Receivers check the deadline before each read: after it passes no further byte may land.
    if (!send && deadline != 0 && NowNs() >= deadline) return IoResult::kTimeout;
    msghdr m{};
    ssize_t n;
    {
      CallWindow w(iov + first, iovcnt - first, &m);
      n = send ? sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) : recvmsg(fd, &m, MSG_DONTWAIT);
    }
    if (n == 0 && !send) return IoResult::kClosed;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Classify(errno);
      lowat.Fit();
      const IoResult w = WaitFd(fd, send ? POLLOUT : POLLIN, deadline);
      if (w != IoResult::kOk) return w;
      continue;
    }
    Advance(iov, iovcnt, &first, static_cast<size_t>(n));
    lowat.Moved(static_cast<size_t>(n));
  }
  return IoResult::kOk;
}

}  // namespace

CallWindow::CallWindow(struct iovec *iov, size_t iovcnt, struct msghdr *m) {
  const size_t most = std::min<size_t>(iovcnt, IOV_MAX);
  size_t k = 0;
  uint64_t sum = 0;
  while (k < most && sum < kSocketCallBytes) sum += iov[k++].iov_len;
  if (sum > kSocketCallBytes) {
    cut_ = &iov[k - 1];
    len_ = cut_->iov_len;
    cut_->iov_len -= sum - kSocketCallBytes;
  }
  m->msg_iov = iov;
  m->msg_iovlen = k;
}

CallWindow::~CallWindow() {
  if (cut_ != nullptr) cut_->iov_len = len_;
}

IoResult SendIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline) {
  return MoveIov(fd, iov, iovcnt, deadline, true);
}

IoResult RecvIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline) {
  return MoveIov(fd, iov, iovcnt, deadline, false);
}

IoResult RecvAll(int fd, void *p, size_t n, int64_t deadline) {
  iovec v{p, n};
  return RecvIov(fd, &v, 1, deadline);
}

IoResult SendFrame(int fd, uint16_t type, uint32_t status, const void *payload, size_t n, int64_t deadline) {
  uint8_t head[kFrameHeaderBytes];
  EncodeHeader(FrameHeader{type, 0, status, n}, head);
  iovec v[2] = {{head, sizeof(head)}, {const_cast<void *>(payload), n}};
  return SendIov(fd, v, n > 0 ? 2 : 1, deadline);
}

IoResult SendFrame(int fd, uint16_t type, uint32_t status, const std::string &payload, int64_t deadline) {
  return SendFrame(fd, type, status, payload.data(), payload.size(), deadline);
}

IoResult RecvHeader(int fd, FrameHeader *h, int64_t deadline) {
  uint8_t head[kFrameHeaderBytes];
  const IoResult r = RecvAll(fd, head, sizeof(head), deadline);
  if (r != IoResult::kOk) return r;
  return DecodeHeader(head, h) ? IoResult::kOk : IoResult::kError;
}

IoResult WaitReadable(int fd) { return WaitFd(fd, POLLIN, 0); }

IoResult RecvReplyHeader(int fd, FrameHeader *h, int64_t deadline) {
  const IoResult w = WaitFd(fd, POLLIN, deadline);
  return w == IoResult::kOk ? RecvHeader(fd, h, deadline) : w;
}

namespace {
// Reads the `len` bytes announced into `out` with `read(p, n)`, growing it only as they arrive: a
// read asks for at most as many bytes as have already come (kPayloadChunk at first), so a peer that
// announces 64 MiB and sends nothing costs kPayloadChunk, not 64 MiB for kFrameNs.
template <typename Read>
IoResult ReadGrowing(uint64_t len, std::string *out, Read &&read) {
  out->clear();
  uint64_t have = 0;
  while (have < len) {
    const uint64_t next = std::min<uint64_t>(len, std::max<uint64_t>(kPayloadChunk, 2 * have));
    out->resize(next);
    const IoResult r = read(&(*out)[have], next - have);
    if (r != IoResult::kOk) return r;
    have = next;
  }
  return IoResult::kOk;
}
}  // namespace

IoResult RecvPayload(int fd, const FrameHeader &h, Channel ch, std::string *out, int64_t deadline) {
  if (h.length > MaxPayload(h.type, ch)) return IoResult::kError;
  return ReadGrowing(h.length, out, [&](char *p, uint64_t n) { return RecvAll(fd, p, n, deadline); });
}

NoSpin::NoSpin() : was_(t_no_spin) { t_no_spin = true; }
NoSpin::~NoSpin() { t_no_spin = was_; }

// ------------------------------------------------------------------ RecvBuffer
size_t RecvBuffer::Take(void *p, size_t n) {
  const size_t k = std::min(n, end_ - pos_);
  memcpy(p, buf_ + pos_, k);
  pos_ += k;
  if (pos_ == end_) pos_ = end_ = 0;
  return k;
}

IoResult RecvBuffer::Fill(int64_t deadline) {
  for (;;) {
    if (deadline != 0 && NowNs() >= deadline) return IoResult::kTimeout;
    const ssize_t n = recv(fd_, buf_ + end_, sizeof(buf_) - end_, MSG_DONTWAIT);
    if (n > 0) {
      end_ += static_cast<size_t>(n);
      return IoResult::kOk;
    }
    if (n == 0) return IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Classify(errno);
    const IoResult w = WaitFd(fd_, POLLIN, deadline);
    if (w != IoResult::kOk) return w;
  }
}

IoResult RecvBuffer::Read(void *p, size_t n, int64_t deadline) {
  uint8_t *d = static_cast<uint8_t *>(p);
  for (;;) {
    const size_t k = Take(d, n);
    d += k;
    n -= k;
    if (n == 0) return IoResult::kOk;
    if (n >= sizeof(buf_)) return RecvAll(fd_, d, n, deadline);  // large: straight to its place
    const IoResult r = Fill(deadline);
    if (r != IoResult::kOk) return r;
  }
}

IoResult RecvBuffer::ReadIov(struct iovec *iov, size_t iovcnt, int64_t deadline) {
  size_t i = 0;
  while (i < iovcnt && !empty()) {
    if (deadline != 0 && NowNs() >= deadline) return IoResult::kTimeout;
    const size_t k = Take(iov[i].iov_base, iov[i].iov_len);
    iov[i].iov_base = static_cast<uint8_t *>(iov[i].iov_base) + k;
    iov[i].iov_len -= k;
    if (iov[i].iov_len == 0) ++i;
  }
  return i == iovcnt ? IoResult::kOk : RecvIov(fd_, iov + i, iovcnt - i, deadline);
}

IoResult RecvBuffer::ReadHeader(FrameHeader *h, int64_t deadline) {
  uint8_t head[kFrameHeaderBytes];
  const IoResult r = Read(head, sizeof(head), deadline);
  if (r != IoResult::kOk) return r;
  return DecodeHeader(head, h) ? IoResult::kOk : IoResult::kError;
}

IoResult RecvBuffer::ReadPayload(const FrameHeader &h, Channel ch, std::string *out, int64_t deadline) {
  if (h.length > MaxPayload(h.type, ch)) return IoResult::kError;
  return ReadGrowing(h.length, out, [&](char *p, uint64_t n) { return Read(p, n, deadline); });
}

Status StatusOf(IoResult r) {
  if (r == IoResult::kOk) return LLM_SUCCESS;
  return r == IoResult::kTimeout ? LLM_TIMEOUT : LLM_LINK_FAILED;
}

void TuneSocket(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

namespace {
bool MakeAddr(const std::string &ip, uint32_t port, sockaddr_storage *ss, socklen_t *len) {
  memset(ss, 0, sizeof(*ss));
  auto *a4 = reinterpret_cast<sockaddr_in *>(ss);
  if (inet_pton(AF_INET, ip.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto *a6 = reinterpret_cast<sockaddr_in6 *>(ss);
  if (inet_pton(AF_INET6, ip.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}
}  // namespace

namespace {
LinkFailureReason ConnectReason(int err) {
  switch (err) {
    case ECONNREFUSED: return LinkFailureReason::kRefused;
    case EHOSTUNREACH: case ENETUNREACH: case EHOSTDOWN: case ENETDOWN: case EADDRNOTAVAIL:
      return LinkFailureReason::kUnreachable;
    case ETIMEDOUT: return LinkFailureReason::kTimedOut;
    default: return LinkFailureReason::kOther;
  }
}
}  // namespace

int ConnectTcp(const std::string &ip, uint16_t port, int64_t deadline, Status *st) {
  sockaddr_storage ss;
  socklen_t len;
  if (!MakeAddr(ip, port, &ss, &len)) {
    *st = Fail(LLM_PARAM_INVALID, "%s is not an IP address", ip.c_str());
    return -1;
  }
  const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *st = Fail(LLM_LINK_FAILED, "socket: %s", strerror(errno));
    return -1;
  }
  int rc = connect(fd, reinterpret_cast<sockaddr *>(&ss), len);
  // EINTR: the connection goes on in the background, as EINPROGRESS (connect(2)).
  if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
    const IoResult w = WaitFd(fd, POLLOUT, deadline);
    if (w != IoResult::kOk) {
      close(fd);
      NoteLinkReason(w == IoResult::kTimeout ? LinkFailureReason::kTimedOut : LinkFailureReason::kOther);
      *st = Fail(StatusOf(w), "connect %s:%u: %s", ip.c_str(), port,
                 w == IoResult::kTimeout ? "no answer before the link timeout (a firewall dropping SYNs, or a "
                                           "host that is down)"
                                         : "failed");
      return -1;
    }
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    const int err = errno;
    close(fd);
    NoteLinkReason(ConnectReason(err));
    *st = Fail(LLM_LINK_FAILED, "connect %s:%u: %s%s", ip.c_str(), port, strerror(err),
               err == ECONNREFUSED ? " (nothing listens on that port: is the peer's llm.ListenIpInfo set, and "
                                     "is it initialized?)"
                                   : "");
    return -1;
  }
  TuneSocket(fd);
  *st = LLM_SUCCESS;
  return fd;
}

bool ListenerEndpoint(int fd, bool opener, Endpoint *out) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  memset(&ss, 0, sizeof(ss));
  const int rc = opener ? getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len)
                        : getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len);
  if (rc != 0) return false;
  *out = Endpoint();
  if (ss.ss_family == AF_INET) {
    const auto *a4 = reinterpret_cast<const sockaddr_in *>(&ss);
    out->family = 4;
    memcpy(out->ip, &a4->sin_addr, 4);
    out->port = ntohs(a4->sin_port);
    return true;
  }
  if (ss.ss_family != AF_INET6) return false;
  const auto *a6 = reinterpret_cast<const sockaddr_in6 *>(&ss);
  out->port = ntohs(a6->sin6_port);
  // A dual-stack listener sees an IPv4 opener as ::ffff:a.b.c.d; the opener dialled a.b.c.d.
  if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
    out->family = 4;
    memcpy(out->ip, a6->sin6_addr.s6_addr + 12, 4);
  } else {
    out->family = 6;
    memcpy(out->ip, a6->sin6_addr.s6_addr, 16);
  }
  return true;
}

int ListenTcp(const std::string &ip, uint32_t port, Status *st) {
  sockaddr_storage ss;
  socklen_t len;
  if (port > 65535 || !MakeAddr(ip, port, &ss, &len)) {
    *st = LLM_PARAM_INVALID;
    return -1;
  }
  const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *st = LLM_FAILED;
    return -1;
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    LogInfo("cannot listen on %s:%u: %s", ip.c_str(), port, strerror(err));
    close(fd);
    *st = Fail(LLM_FAILED, "listen %s:%u: %s", ip.c_str(), port, strerror(err));
    return -1;
  }
  *st = LLM_SUCCESS;
  return fd;
}

}  // namespace kvblocks
