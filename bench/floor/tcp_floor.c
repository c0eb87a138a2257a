// SPDX-License-Identifier: Apache-2.0
// The kernel's floor for a loopback TCP stream, from C alone: 256 MiB per call from one process to
// another, either contiguous (1 MiB send()/recv(), the bench's raw C stream) or as the bench's large
// transfer moves it (4096 random 64 KiB blocks gathered with sendmsg() and scattered with recvmsg(),
// 64 iovecs a call; then the same with the receiver's SO_RCVLOWAT at 2 MiB, as kvblocks sets it for
// large receives), and as kvblocks moves it now (both ends non-blocking, waiting in poll(), at most
// 1 MiB a call, the receiver's mark at 2 MiB), each call acknowledged with one byte. Then round trips: an 8-byte ping-pong, and an
// 8-byte request answered with 16 random 4 KiB blocks of a 1 MiB cache, scattered into random blocks
// of another (the bench's small pull and its raw-socket floor). kvblocks' tcp path cannot beat these.
//   cc -O2 bench/floor/tcp_floor.c -o tcp_floor && ./tcp_floor [calls]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BB (64u << 10)
#define NB 4096u  // blocks per call (256 MiB)
#define IOV 64

// Receives exactly n bytes; `spin`: polls with MSG_DONTWAIT instead of sleeping in the kernel.
static int recv_all(int fd, void *buf, size_t n, int spin) {
  for (size_t got = 0; got < n;) {
    const ssize_t r = recv(fd, (uint8_t *)buf + got, n - got, spin ? MSG_DONTWAIT : MSG_WAITALL);
    if (r > 0) got += (size_t)r;
    else if (!(r < 0 && spin)) return -1;
  }
  return 0;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// Receives with MSG_DONTWAIT and waits in poll() with SO_RCVLOWAT at min(lowat, bytes still to come),
// as kvblocks does: a blocking recvmsg() cannot lower the mark for the tail of its own iovecs.
static ssize_t recv_lowat(int fd, struct msghdr *m, int lowat, size_t *left) {
  for (;;) {
    const ssize_t r = recvmsg(fd, m, MSG_DONTWAIT);
    if (r > 0) return *left -= (size_t)r, r;
    if (r == 0 || errno != EAGAIN) return -1;
    const int mark = *left < (size_t)lowat ? (int)*left : lowat;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof(mark));
    struct pollfd p = {fd, POLLIN, 0};
    poll(&p, 1, -1);
  }
}

// Waits in poll() for `ev` (a non-blocking call got EAGAIN).
static void wait_fd(int fd, short ev) {
  struct pollfd p = {fd, ev, 0};
  poll(&p, 1, -1);
}

// One call's bytes through fd; `send` picks the direction. Random mode walks `ids`, `iov` blocks a
// call; `lowat` > 0: received through recv_lowat(); `nb`: sent with MSG_DONTWAIT, waiting in poll().
static int move(int fd, uint8_t *buf, const uint32_t *ids, int random, int send, int lowat, int iov, int nb) {
  size_t left = (size_t)NB * BB;
  struct iovec v[IOV];
  for (uint32_t b = 0; b < NB;) {
    int n = 0;
    if (random)
      for (; n < iov && b < NB; ++n, ++b) v[n] = (struct iovec){buf + (size_t)ids[b] * BB, BB};
    else
      v[n++] = (struct iovec){buf + (size_t)b * BB, 16 * BB}, b += 16;
    struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)n};
    while (m.msg_iovlen > 0) {
      ssize_t r = send ? sendmsg(fd, &m, nb ? MSG_DONTWAIT : 0) : lowat ? recv_lowat(fd, &m, lowat, &left) : recvmsg(fd, &m, MSG_WAITALL);
      if (r < 0 && send && nb && errno == EAGAIN) {
        wait_fd(fd, POLLOUT);
        continue;
      }
      if (r <= 0) return -1;
      while (m.msg_iovlen > 0 && (size_t)r >= m.msg_iov->iov_len) r -= (ssize_t)m.msg_iov->iov_len, ++m.msg_iov, --m.msg_iovlen;
      if (m.msg_iovlen > 0) m.msg_iov->iov_base = (uint8_t *)m.msg_iov->iov_base + r, m.msg_iov->iov_len -= (size_t)r;
    }
  }
  return 0;
}

// The 16 random 4 KiB blocks of round trip k at one end (side 0 sends, side 1 receives), drawn
// from a 1 MiB cache of 256 blocks as the bench's small pull draws them: the call cycles through
// 64 such lists, so the blocks are warm in the caches but not all hot.
static void round_blocks(struct iovec *v, uint8_t *cache, const uint32_t *ids, int k, int side) {
  for (int i = 0; i < 16; ++i) v[i] = (struct iovec){cache + (size_t)(ids[(k % 64) * 32 + side * 16 + i] % 256) * 4096, 4096};
}

// Round trip k's blocks in one sendmsg.
static int reply_blocks(int fd, uint8_t *buf, const uint32_t *ids, int k) {
  struct iovec v[16];
  round_blocks(v, buf, ids, k, 0);
  struct msghdr m = {.msg_iov = v, .msg_iovlen = 16};
  return sendmsg(fd, &m, 0) == 16 * 4096 ? 0 : -1;
}

// Round trip k's blocks scattered with recvmsg; `spin`: polls with MSG_DONTWAIT.
static int recv_blocks(int fd, uint8_t *cache, const uint32_t *ids, int k, int spin) {
  struct iovec v[16];
  round_blocks(v, cache, ids, k, 1);
  struct msghdr m = {.msg_iov = v, .msg_iovlen = 16};
  while (m.msg_iovlen > 0) {
    ssize_t r = recvmsg(fd, &m, spin ? MSG_DONTWAIT : MSG_WAITALL);
    if (r < 0 && spin) continue;
    if (r <= 0) return -1;
    while (m.msg_iovlen > 0 && (size_t)r >= m.msg_iov->iov_len) r -= (ssize_t)m.msg_iov->iov_len, ++m.msg_iov, --m.msg_iovlen;
    if (m.msg_iovlen > 0) m.msg_iov->iov_base = (uint8_t *)m.msg_iov->iov_base + r, m.msg_iov->iov_len -= (size_t)r;
  }
  return 0;
}

static double rtt(int fd, uint8_t *cache, const uint32_t *ids, int blocks, int spin, int n) {
  static uint8_t in[8];
  double s[2000];
  char req[8] = {spin ? (blocks ? 'B' : 'P') : (blocks ? 'b' : 'p')};
  for (int i = 0; i < n; ++i) {
    req[1] = (char)(i % 64);  // the round trip's list, for both ends
    const double t0 = now();
    if (write(fd, req, 8) != 8) exit(1);
    if ((blocks ? recv_blocks(fd, cache, ids, i, spin) : recv_all(fd, in, 8, spin)) != 0) exit(1);
    s[i] = now() - t0;
  }
  qsort(s, (size_t)n, sizeof(double), cmp);
  return s[n / 2];
}

int main(int argc, char **argv) {
  const int calls = argc > 1 ? atoi(argv[1]) : 15;
  uint8_t *buf = malloc((size_t)NB * BB * 2);
  uint32_t *ids = malloc(NB * sizeof(uint32_t));
  memset(buf, 1, (size_t)NB * BB * 2);
  for (uint32_t i = 0; i < NB; ++i) ids[i] = i * 2;  // every other block of a 512 MiB cache...
  srand(7);
  for (uint32_t i = NB - 1; i > 0; --i) {  // ...in random order
    const uint32_t j = (uint32_t)rand() % (i + 1), t = ids[i];
    ids[i] = ids[j], ids[j] = t;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  bind(ls, (struct sockaddr *)&a, sizeof(a));
  listen(ls, 1);
  getsockname(ls, (struct sockaddr *)&a, &al);
  pid_t child = fork();
  if (child == 0) {  // the receiver
    int spinning = 0;
    int fd = accept(ls, NULL, NULL);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (char mode; recv_all(fd, &mode, 1, spinning) == 0;) {
      if (mode == 'p' || mode == 'b' || mode == 'P' || mode == 'B') {  // a round trip (upper case: spinning)
        char req[7];
        spinning = mode == 'P' || mode == 'B';
        if (recv_all(fd, req, 7, spinning) != 0) return 1;
        if ((mode | 0x20) == 'p' ? write(fd, "12345678", 8) != 8 : reply_blocks(fd, buf, ids, req[0]) != 0) return 1;
        continue;
      }
      spinning = 0;
      if (move(fd, buf, ids, mode != 'c', 0, mode == 'l' || mode == 'k' ? 2 << 20 : 0, mode == 'k' ? 16 : IOV, 0) != 0 ||
          write(fd, "k", 1) != 1)
        return 1;
      setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));  // or a small request sleeps forever
    }
    return 0;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) return 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  double t[4][64];
  const int n = calls < 64 ? calls : 64;
  for (int i = 0; i < n; ++i)
    for (int mode = 0; mode < 4; ++mode) {  // the four modes interleaved
      char k;
      const double t0 = now();
      if (write(fd, &"crlk"[mode], 1) != 1 || move(fd, buf, ids, mode > 0, 1, 0, mode == 3 ? 16 : IOV, mode == 3) != 0 ||
          read(fd, &k, 1) != 1)
        return 1;
      t[mode][i] = now() - t0;
    }
  printf("%-52s %8s %8s\n", "256 MiB per call over loopback TCP", "GB/s", "ms");
  const char *names[4] = {"contiguous, 1 MiB send/recv", "4096 random 64 KiB blocks, sendmsg/recvmsg",
                          "the same, receiver SO_RCVLOWAT 2 MiB", "the same, <= 1 MiB a call, non-blocking (kvblocks)"};
  for (int mode = 0; mode < 4; ++mode) {
    qsort(t[mode], (size_t)n, sizeof(double), cmp);
    const double med = t[mode][n / 2];
    printf("%-52s %8.2f %8.1f\n", names[mode], (double)NB * BB / med / 1e9, med * 1e3);
  }
  for (int spin = 0; spin < 2; ++spin) {  // both ends sleeping in recv(), then both polling
    double p[5], b[5];
    for (int k = 0; k < 5; ++k)  // interleaved rounds; the receiver's cache is the upper half of buf
      p[k] = rtt(fd, NULL, ids, 0, spin, 400), b[k] = rtt(fd, buf + (size_t)NB * BB, ids, 1, spin, 400);
    qsort(p, 5, sizeof(double), cmp);
    qsort(b, 5, sizeof(double), cmp);
    const char *how = spin ? "polling" : "sleeping";
    printf("8-byte ping-pong, %-34s %8.1f us\n", how, p[2] * 1e6);
    printf("16 x 4 KiB random reply, %-27s %8.1f us  (%.2fx the ping-pong)\n", how, b[2] * 1e6, b[2] / p[2]);
  }
  close(fd);
  waitpid(child, NULL, 0);
  return 0;
}
