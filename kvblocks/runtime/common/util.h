// SPDX-License-Identifier: Apache-2.0
// Clocks, logging, option parsing and randomness.
#ifndef KVBLOCKS_RUNTIME_COMMON_UTIL_H_
#define KVBLOCKS_RUNTIME_COMMON_UTIL_H_

#include <signal.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvblocks {

int64_t NowNs();  // CLOCK_MONOTONIC
void LogWarn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void LogInfo(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool ParseUint(const std::string &s, uint64_t max, uint64_t *out);  // decimal digits only
bool ParseHostPort(const std::string &s, std::string *ip, uint32_t *port);
void RandomBytes(void *out, size_t n);

// Blocks every asynchronous signal in the calling thread while it lives, then restores the mask.
// Threads started meanwhile inherit the blocked mask from their first instruction, so Python's
// handlers (SIGINT, SIGALRM, ...) run on the main thread and never interrupt a runtime thread.
// Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay unblocked.
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked();
  ~AsyncSignalsBlocked();
  AsyncSignalsBlocked(const AsyncSignalsBlocked &) = delete;
  AsyncSignalsBlocked &operator=(const AsyncSignalsBlocked &) = delete;

 private:
  sigset_t old_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_COMMON_UTIL_H_
