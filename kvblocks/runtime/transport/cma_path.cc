// SPDX-License-Identifier: Apache-2.0
// Cross-memory attach: process_vm_readv/writev on a same-host peer's registered memory.
#include <errno.h>
#include <sys/uio.h>

#include <climits>

#include "common/util.h"
#include "transport/path.h"
#include "transport/split.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

Status CmaRange(const Plan &plan, pid_t pid, const std::vector<uint64_t> &remote, const std::vector<uint64_t> &local,
                bool pull, int64_t deadline, size_t begin, size_t end) {
  std::vector<iovec> liov, riov;
  liov.reserve(IOV_MAX);
  riov.reserve(IOV_MAX);
  auto flush = [&]() -> Status {
    size_t expect = 0;
    for (const auto &v : liov) expect += v.iov_len;
    const ssize_t n = pull ? process_vm_readv(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0)
                           : process_vm_writev(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0);
    liov.clear();
    riov.clear();
    if (n == static_cast<ssize_t>(expect)) return LLM_SUCCESS;
    if (n < 0 && errno == ESRCH) return LLM_LINK_FAILED;  // the peer process is gone
    return LLM_FAILED;
  };
  for (size_t i = begin; i < end; ++i) {
    const uint64_t rbase = remote[pull ? plan.src_tensors[i] : plan.dst_tensors[i]];
    uint8_t *lbase = reinterpret_cast<uint8_t *>(local[pull ? plan.dst_tensors[i] : plan.src_tensors[i]]);
    for (const Segment &g : plan.segs) {
      const uint64_t roff = pull ? g.src_off : g.dst_off, loff = pull ? g.dst_off : g.src_off;
      liov.push_back(iovec{lbase + loff, g.len});
      riov.push_back(iovec{reinterpret_cast<void *>(rbase + roff), g.len});
      if (liov.size() == IOV_MAX) {
        const Status st = flush();
        if (st != LLM_SUCCESS) return st;
        if (NowNs() > deadline) return LLM_TIMEOUT;
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
