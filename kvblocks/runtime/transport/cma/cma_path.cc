// SPDX-License-Identifier: Apache-2.0
// Cross-memory attach: process_vm_readv/writev on a same-host peer's registered memory.
#include <errno.h>
#include <sys/uio.h>

#include <climits>
#include <cstring>
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

// Plans of many small ranges (a layout transform, scattered small blocks). The kernel pins the
// remote pages once per remote iovec, about 1.1-1.8 us each on this machine whatever its length up to
// a page (bench/floor/cma_iov.c): 256-byte iovecs move 0.2 GB/s, against 1.8-2 GB/s for large ones;
// and it walks local iovecs one small copy at a time. So the ranges are taken in the remote side's
// order; those adjacent there share one remote iovec, and a pull also reads a gap of up to
// kGapBytes between two ranges (bytes of the same registered tensor, dropped) rather than start
// another. Small ranges go through a staging buffer, one local iovec: a pull scatters them from it
// after the read, a push gathers them into it before the write.
constexpr uint64_t kGapBytes = 2048;         // about one remote iovec's pinning cost in copy time
constexpr uint64_t kPieceBytes = 1ULL << 20;  // remote bytes per work item (and per deadline check)
constexpr uint64_t kStageBytes = kPieceBytes + 2 * kSmallRangeBytes + kGapBytes;  // a piece's staged bytes, at most

// A piece is one thread's and one look at the clock: a range longer than a piece (rare in a plan of
// small ranges) goes the usual way, cut by Chunking.
bool NoLongRange(const Plan &plan) {
  for (const Segment &g : plan.segs)
    if (g.len > kPieceBytes) return false;
  return true;
}

// The plan in remote order, cut into pieces of about kPieceBytes of remote bytes (gaps included).
struct Merged {
  const std::vector<uint32_t> &order;
  std::vector<size_t> cuts;  // piece p is order[cuts[p], cuts[p + 1])
  Merged(const Plan &plan, bool pull) : order(plan.Order(pull)) {
    cuts.push_back(0);
    uint64_t acc = 0, end = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      const Segment &g = plan.segs[order[k]];
      const uint64_t off = pull ? g.src_off : g.dst_off;
      const bool gap = pull && k > 0 && off >= end && off - end <= kGapBytes;
      acc += g.len + (gap ? off - end : 0);
      end = off + g.len;
      if (acc >= kPieceBytes) {
        cuts.push_back(k + 1);
        acc = 0;
      }
    }
    if (cuts.back() != order.size()) cuts.push_back(order.size());
  }
  size_t pieces() const { return cuts.size() - 1; }
};

// The iovecs of one process_vm_readv/writev of a merged piece, and its staging buffer.
struct MergedCall {
  std::vector<iovec> liov, riov;
  std::vector<uint8_t> stage = std::vector<uint8_t>(kStageBytes);
  struct Scatter {
    uint64_t at;
    uint8_t *to;
    uint64_t len;
  };
  std::vector<Scatter> scatter;  // a pull's staged ranges, copied out after the read
  uint64_t staged = 0, pending = 0;

  void Local(uint8_t *p, size_t len) {
    if (!liov.empty() && static_cast<uint8_t *>(liov.back().iov_base) + liov.back().iov_len == p)
      liov.back().iov_len += len;
    else
      liov.push_back(iovec{p, len});
  }
  // `len` bytes of the stream that land in (pull) or come from (push) staging.
  uint8_t *Stage(uint64_t len) {
    uint8_t *p = stage.data() + staged;
    Local(p, len);
    staged += len;
    return p;
  }
  Status Flush(pid_t pid, bool pull) {
    const ssize_t n = pull ? process_vm_readv(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0)
                           : process_vm_writev(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0);
    const bool ok = n == static_cast<ssize_t>(pending);
    if (ok)
      for (const Scatter &s : scatter) memcpy(s.to, stage.data() + s.at, s.len);
    liov.clear();
    riov.clear();
    scatter.clear();
    staged = pending = 0;
    if (n < 0 && errno == ESRCH) return LLM_LINK_FAILED;  // the peer process is gone
    return ok ? LLM_SUCCESS : LLM_FAILED;
  }
};

// One piece of one tensor pair: remote iovecs merged and small ranges staged, as above.
Status MergedChunk(const Merged &m, const Plan &plan, pid_t pid, uint64_t rbase, uint64_t lbase, bool pull,
                   int64_t deadline, size_t c, size_t piece) {
  if (c != 0 && NowNs() > deadline) return LLM_TIMEOUT;
  thread_local MergedCall call;
  call.liov.clear();
  call.riov.clear();
  call.scatter.clear();
  call.staged = call.pending = 0;
  for (size_t k = m.cuts[piece]; k < m.cuts[piece + 1]; ++k) {
    const Segment &g = plan.segs[m.order[k]];
    const uint64_t r = rbase + (pull ? g.src_off : g.dst_off);  // the peer's address: arithmetic only
    uint8_t *const l = reinterpret_cast<uint8_t *>(lbase + (pull ? g.dst_off : g.src_off));
    if (call.liov.size() + 2 > IOV_MAX || call.riov.size() >= IOV_MAX ||
        call.staged + g.len + kGapBytes > kStageBytes) {
      const Status st = call.Flush(pid, pull);
      if (st != LLM_SUCCESS) return st;
    }
    const uint64_t end = call.riov.empty() ? 0 : reinterpret_cast<uint64_t>(call.riov.back().iov_base) +
                                                     call.riov.back().iov_len;
    if (!call.riov.empty() && r >= end && (r == end || (pull && r - end <= kGapBytes))) {
      const uint64_t gap = r - end;
      if (gap > 0) call.Stage(gap);  // a gap of the same tensor, read and dropped
      call.riov.back().iov_len += gap + g.len;
      call.pending += gap;
    } else {
      call.riov.push_back(iovec{reinterpret_cast<void *>(r), g.len});
    }
    if (g.len >= kSmallRangeBytes) {
      call.Local(l, g.len);
    } else if (pull) {
      call.scatter.push_back(MergedCall::Scatter{call.staged, l, g.len});
      call.Stage(g.len);
    } else {
      memcpy(call.Stage(g.len), l, g.len);
    }
    call.pending += g.len;
  }
  return call.riov.empty() ? LLM_SUCCESS : call.Flush(pid, pull);
}

class CmaPath : public Path {
 public:
  CmaPath(int pid, std::vector<uint64_t> remote) : pid_(pid), remote_(std::move(remote)) {}
  const char *name() const override { return "cma"; }
  PathMode mode() const override { return PathMode::kLocalCopy; }
  Status Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) override {
    if (plan.SmallRanges() && NoLongRange(plan)) return ExecuteMerged(plan, local, pull, deadline);
    const Chunking chunks(plan, kDeadlineCheckBytes);
    auto one = [&](size_t c) {
      return CmaChunk(chunks, plan, static_cast<pid_t>(pid_), remote_, local.addrs, pull, deadline, c);
    };
    return RunChunks(chunks.count(), plan.total_bytes(), one);
  }

 private:
  Status ExecuteMerged(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) {
    const Merged m(plan, pull);  // sorts on this thread, before the pool shares the plan
    const size_t per = m.pieces();
    auto one = [&](size_t c) {
      const size_t i = c / per;
      const uint64_t rbase = remote_[pull ? plan.src_tensors[i] : plan.dst_tensors[i]];
      const uint64_t lbase = local.addrs[pull ? plan.dst_tensors[i] : plan.src_tensors[i]];
      return MergedChunk(m, plan, static_cast<pid_t>(pid_), rbase, lbase, pull, deadline, c, c % per);
    };
    return RunChunks(per * plan.src_tensors.size(), plan.total_bytes(), one);
  }

  int pid_;
  std::vector<uint64_t> remote_;
};

}  // namespace

std::unique_ptr<Path> MakeCmaPath(int pid, std::vector<uint64_t> remote_tensors) {
  return std::unique_ptr<Path>(new CmaPath(pid, std::move(remote_tensors)));
}

}  // namespace kvblocks
