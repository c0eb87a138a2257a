// SPDX-License-Identifier: Apache-2.0
// Clocks, logging, option parsing, randomness.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/util.h"
#include "kvblocks/log.h"

namespace kvblocks {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

namespace {
int LogLevel() {
  // KVBLOCKS_LOG_LEVEL: 0 = silent, 1 = warnings (default), 2 = info.
  static const int level = [] {
    const char *v = getenv("KVBLOCKS_LOG_LEVEL");
    return v != nullptr ? atoi(v) : 1;
  }();
  return level;
}

// The callback and its argument change together, under g_log_mu, which every call holds too: once
// SetLogCallback returns, the old callback is never called again.
std::mutex g_log_mu;
LogCallback g_log_cb = nullptr;
void *g_log_user = nullptr;

void Emit(int level, const char *tag, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  std::lock_guard<std::mutex> g(g_log_mu);
  if (g_log_cb != nullptr)
    g_log_cb(g_log_user, level, msg);
  else
    fprintf(stderr, "[kvblocks %s pid=%d] %s\n", tag, static_cast<int>(getpid()), msg);
}
}  // namespace

void SetLogCallback(LogCallback cb, void *user) noexcept {
  std::lock_guard<std::mutex> g(g_log_mu);
  g_log_cb = cb;
  g_log_user = user;
}

#define KVBLOCKS_LOG(min_level, tag)   \
  do {                                 \
    if (LogLevel() < (min_level)) return; \
    va_list ap;                        \
    va_start(ap, fmt);                 \
    Emit(min_level, tag, fmt, ap);     \
    va_end(ap);                        \
  } while (0)

void LogWarn(const char *fmt, ...) { KVBLOCKS_LOG(kLogWarn, "WARN"); }
void LogInfo(const char *fmt, ...) { KVBLOCKS_LOG(kLogInfo, "INFO"); }
#undef KVBLOCKS_LOG

bool ParseUint(const std::string &s, uint64_t max, uint64_t *out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (__builtin_mul_overflow(v, 10ULL, &v) || __builtin_add_overflow(v, static_cast<uint64_t>(c - '0'), &v))
      return false;
  }
  if (v > max) return false;
  *out = v;
  return true;
}

bool ParseHostPort(const std::string &s, std::string *ip, uint32_t *port) {
  std::string host, port_s;
  if (!s.empty() && s[0] == '[') {  // [ipv6]:port
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return false;
    host = s.substr(1, close - 1);
    port_s = s.substr(close + 2);
    in6_addr a6;
    if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) return false;
  } else {
    const size_t colon = s.find(':');
    if (colon == std::string::npos || s.find(':', colon + 1) != std::string::npos) return false;
    host = s.substr(0, colon);
    port_s = s.substr(colon + 1);
    in_addr a4;
    if (inet_pton(AF_INET, host.c_str(), &a4) != 1) return false;
  }
  uint64_t p;
  if (!ParseUint(port_s, 0xFFFFFFFFULL, &p)) return false;
  *ip = host;
  *port = static_cast<uint32_t>(p);
  return true;
}

void RandomBytes(void *out, size_t n) {
  uint8_t *p = static_cast<uint8_t *>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      // getrandom fails without a seeded pool or where the syscall is missing: /dev/urandom then.
      const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        ssize_t r;
        do {
          r = read(fd, p, n);
        } while (r < 0 && errno == EINTR);
        close(fd);
        if (r > 0) {
          p += r;
          n -= static_cast<size_t>(r);
          continue;
        }
      }
      continue;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

AsyncSignalsBlocked::AsyncSignalsBlocked() {
  sigset_t all;
  sigfillset(&all);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&all, sig);
  pthread_sigmask(SIG_BLOCK, &all, &old_);
}

AsyncSignalsBlocked::~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

}  // namespace kvblocks
