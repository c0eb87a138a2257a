// SPDX-License-Identifier: Apache-2.0
// Non-blocking socket I/O with deadlines (NowNs() clock; 0 = none, for serving threads woken by
// shutdown()), and framed messages on top of it.
#ifndef KVBLOCKS_RUNTIME_NET_SOCKET_H_
#define KVBLOCKS_RUNTIME_NET_SOCKET_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "wire/messages.h"

namespace kvblocks {

enum class IoResult { kOk, kTimeout, kClosed, kError };

// Points `m` at one socket call's share of iov[0..iovcnt): at most IOV_MAX iovecs and
// kSocketCallBytes, the last iovec cut to fit while the window lives (restored after).
class CallWindow {
 public:
  CallWindow(struct iovec *iov, size_t iovcnt, struct msghdr *m);
  ~CallWindow();
  CallWindow(const CallWindow &) = delete;
  CallWindow &operator=(const CallWindow &) = delete;

 private:
  struct iovec *cut_ = nullptr;
  size_t len_ = 0;
};

IoResult SendIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline);
IoResult RecvIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline);  // checks the deadline per read
IoResult RecvAll(int fd, void *p, size_t n, int64_t deadline);

IoResult SendFrame(int fd, uint16_t type, uint32_t status, const void *payload, size_t n, int64_t deadline);
IoResult SendFrame(int fd, uint16_t type, uint32_t status, const std::string &payload, int64_t deadline);
IoResult RecvHeader(int fd, FrameHeader *h, int64_t deadline);  // kError on bad magic
// Waits without a deadline (serving threads, which shutdown() wakes) until `fd` is readable or hung
// up, spinning first as every read; kError only when poll() fails.
IoResult WaitReadable(int fd);
// True when bytes of `fd` were read from the socket already and wait in its TLS session: poll()
// would not see them, so a wait before a read checks this first (WaitReadable, RecvReplyHeader).
bool Buffered(int fd);
// One non-blocking sendmsg of what the socket takes now (through the TLS session, if any): bytes
// written, or -1 with errno (EAGAIN: wait for POLLOUT, then call again with the same bytes first).
ssize_t SendSome(int fd, struct iovec *iov, size_t iovcnt);
// RecvHeader of the reply to a request this thread just wrote: waits for it (spinning first, as
// every read) before the first read, which would otherwise fail with EAGAIN and cost a system call.
IoResult RecvReplyHeader(int fd, FrameHeader *h, int64_t deadline);
// Reads the payload announced by `h`: kError, before anything is allocated, when it is longer
// than its type may be on `ch` (MaxPayload); else `out` grows with the bytes that arrive.
IoResult RecvPayload(int fd, const FrameHeader &h, Channel ch, std::string *out, int64_t deadline);

// Encodes `msg` and sends it as one frame.
template <typename M>
IoResult SendMessage(int fd, uint16_t type, uint32_t status, const M &msg, int64_t deadline) {
  std::string payload;
  Encode(msg, &payload);
  return SendFrame(fd, type, status, payload, deadline);
}

int ConnectTcp(const std::string &ip, uint16_t port, int64_t deadline, llm_datadist::Status *st);
int ListenTcp(const std::string &ip, uint32_t port, llm_datadist::Status *st);
// The listener's address on connection `fd` (what a handshake proof covers): the opener asks for
// the peer's address (the one it dialled), the listener for its own end of the accepted socket.
// False when the kernel does not say, or for a socket that is not a stream over IPv4/IPv6.
bool ListenerEndpoint(int fd, bool opener, Endpoint *out);
void TuneSocket(int fd);

// While one lives, reads on this thread wait in poll() without spinning first (see WaitFd): for
// threads that always have more work queued, where a spin only takes a core from the peer.
class NoSpin {
 public:
  NoSpin();
  ~NoSpin();
  NoSpin(const NoSpin &) = delete;
  NoSpin &operator=(const NoSpin &) = delete;

 private:
  bool was_;
};

// The receiving side of a serving channel: reads as much as the socket has into a buffer, so a
// run of pipelined requests costs one recv, not a poll and two recvs each. Bytes beyond the buffer
// (large inline data) are read straight into their destination.
class RecvBuffer {
 public:
  explicit RecvBuffer(int fd) : fd_(fd) {}
  bool empty() const { return pos_ == end_; }
  IoResult Read(void *p, size_t n, int64_t deadline);
  // Like RecvIov: the deadline is checked before every copy or read into `iov`.
  IoResult ReadIov(struct iovec *iov, size_t iovcnt, int64_t deadline);
  IoResult ReadHeader(FrameHeader *h, int64_t deadline);
  IoResult ReadPayload(const FrameHeader &h, Channel ch, std::string *out, int64_t deadline);  // as RecvPayload

 private:
  size_t Take(void *p, size_t n);
  IoResult Fill(int64_t deadline);  // at least one more byte, as many as the socket has

  int fd_;
  size_t pos_ = 0, end_ = 0;
  uint8_t buf_[16384];
};

llm_datadist::Status StatusOf(IoResult r);  // timeout -> LLM_TIMEOUT, other failures -> LLM_LINK_FAILED

// Appends [p, p+len) to an iovec list, merging it into the last entry when they touch.
inline void AppendIov(std::vector<iovec> *v, uint8_t *p, size_t len) {
  if (len == 0) return;
  if (!v->empty()) {
    iovec &last = v->back();
    if (static_cast<uint8_t *>(last.iov_base) + last.iov_len == p) {
      last.iov_len += len;
      return;
    }
  }
  v->push_back(iovec{p, len});
}

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_NET_SOCKET_H_
