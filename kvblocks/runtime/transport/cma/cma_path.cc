// SPDX-License-Identifier: Apache-2.0
// Cross-memory attach: process_vm_readv/writev on a same-host peer's registered memory.
#include <errno.h>
#include <sys/uio.h>

#include <climits>
#include <vector>

#include "common/limits.h"
#include "common/util.h"
#include "transport/cma/cma_path.h"
#include "transport/path.h"
#include "transport/copy_pool.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

// One chunk (transport/copy_pool.h): one process_vm_readv/writev per IOV_MAX pieces, after a look
// at the clock (but for the first chunk, as every one-sided copy).
Status CmaChunk(const Chunking &chunks, const Plan &plan, pid_t pid, const std::vector<uint64_t> &remote,
                const std::vector<uint64_t> &local, bool pull, int64_t deadline, size_t c) {
  if (c != 0 && NowNs() > deadline) return LLM_TIMEOUT;
  thread_local std::vector<iovec> liov, riov;
  liov.clear();
  riov.clear();
  uint64_t pending = 0;
  Status st = LLM_SUCCESS;
  auto flush = [&] {
    const ssize_t n = pull ? process_vm_readv(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0)
                           : process_vm_writev(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0);
    if (n < 0 && errno == ESRCH) st = LLM_LINK_FAILED;  // the peer process is gone
    else if (n != static_cast<ssize_t>(pending)) st = LLM_FAILED;
    liov.clear();
    riov.clear();
    pending = 0;
  };
  chunks.ForEach(c, [&](size_t i, const Segment &g) {
    if (st != LLM_SUCCESS) return;
    const uint64_t rbase = remote[pull ? plan.src_tensors[i] : plan.dst_tensors[i]];
    const uint64_t lbase = local[pull ? plan.dst_tensors[i] : plan.src_tensors[i]];
    const uint64_t roff = pull ? g.src_off : g.dst_off, loff = pull ? g.dst_off : g.src_off;
    liov.push_back(iovec{reinterpret_cast<void *>(lbase + loff), g.len});
    riov.push_back(iovec{reinterpret_cast<void *>(rbase + roff), g.len});
    pending += g.len;
    if (liov.size() == IOV_MAX) flush();
  });
  if (st == LLM_SUCCESS && !liov.empty()) flush();
  return st;
}

class CmaPath : public Path {
 public:
  CmaPath(int pid, std::vector<uint64_t> remote) : pid_(pid), remote_(std::move(remote)) {}
  const char *name() const override { return "cma"; }
  PathMode mode() const override { return PathMode::kLocalCopy; }
  Status Execute(const Plan &plan, const CacheEntry &local, bool pull, int64_t deadline) override {
    const Chunking chunks(plan, kDeadlineCheckBytes);
    auto one = [&](size_t c) {
      return CmaChunk(chunks, plan, static_cast<pid_t>(pid_), remote_, local.addrs, pull, deadline, c);
    };
    return RunChunks(chunks.count(), plan.total_bytes(), one);
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
