// SPDX-License-Identifier: Apache-2.0
// Cross-memory attach: process_vm_readv/writev on a same-host peer's registered memory.
#include <errno.h>
#include <sys/uio.h>

#include <algorithm>
#include <climits>

#include "common/limits.h"

#include "common/util.h"
#include "transport/path.h"
#include "transport/split.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

// One process_vm_readv/writev per IOV_MAX entries or kDeadlineCheckBytes, whichever comes first,
// with a look at the clock after each.
Status CmaRange(const Plan &plan, pid_t pid, const std::vector<uint64_t> &remote, const std::vector<uint64_t> &local,
                bool pull, int64_t deadline, size_t begin, size_t end) {
  std::vector<iovec> liov, riov;
  liov.reserve(IOV_MAX);
  riov.reserve(IOV_MAX);
  uint64_t pending = 0;
  bool flushed = false;
  auto flush = [&]() -> Status {
    const ssize_t n = pull ? process_vm_readv(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0)
                           : process_vm_writev(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0);
    const int err = errno;
    liov.clear();
    riov.clear();
    const uint64_t expect = pending;
    pending = 0;
    if (n == static_cast<ssize_t>(expect)) return LLM_SUCCESS;
    if (n < 0 && err == ESRCH) return LLM_LINK_FAILED;  // the peer process is gone
    return LLM_FAILED;
  };
  for (size_t i = begin; i < end; ++i) {
    const uint64_t rbase = remote[pull ? plan.src_tensors[i] : plan.dst_tensors[i]];
    uint8_t *lbase = reinterpret_cast<uint8_t *>(local[pull ? plan.dst_tensors[i] : plan.src_tensors[i]]);
    for (const Segment &g : plan.segs) {
      const uint64_t roff = pull ? g.src_off : g.dst_off, loff = pull ? g.dst_off : g.src_off;
      for (uint64_t off = 0; off < g.len;) {
        if (flushed) {  // more to move: is there still time?
          flushed = false;
          if (NowNs() > deadline) return LLM_TIMEOUT;
        }
        const uint64_t n = std::min(g.len - off, kDeadlineCheckBytes - pending);
        liov.push_back(iovec{lbase + loff + off, n});
        riov.push_back(iovec{reinterpret_cast<void *>(rbase + roff + off), n});
        off += n;
        pending += n;
        if (liov.size() == IOV_MAX || pending >= kDeadlineCheckBytes) {
          const Status st = flush();
          if (st != LLM_SUCCESS) return st;
          flushed = true;
        }
      }
    }
  }
  return liov.empty() ? LLM_SUCCESS : flush();
}

class CmaPath : public Path {
 public:
  CmaPath(int pid, std::vector<uint64_t> remote) : pid_(pid), remote_(std::move(remote)) {}
  const char *name() const override { return "cma"; }
  Status Execute(const Plan &plan, const CacheEntry &local, bool pull, int64_t deadline) override {
    return RunSplit(plan, [&](size_t b, size_t e) {
      return CmaRange(plan, static_cast<pid_t>(pid_), remote_, local.addrs, pull, deadline, b, e);
    });
  }

 private:
  int pid_;
  std::vector<uint64_t> remote_;
};

}  // namespace

std::unique_ptr<Path> MakeCmaPath(int pid, std::vector<uint64_t> remote_tensors) {
  return std::unique_ptr<Path>(new CmaPath(pid, std::move(remote_tensors)));
}

}  // namespace kvblocks
