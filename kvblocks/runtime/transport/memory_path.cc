// SPDX-License-Identifier: Apache-2.0
// memcpy between this process's memory and memory it can address directly: another engine of
// this process, or a same-host peer's memfd mapped here.
#include <algorithm>
#include <cstring>

#include "common/limits.h"

#include "common/util.h"
#include "transport/path.h"
#include "transport/split.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

// memcpy over every (tensor pair in [begin, end), segment); src/dst bases indexed by tensor. Large
// segments go in kDeadlineCheckBytes pieces, and the clock is read after each such amount.
Status CopyRange(const Plan &plan, uint8_t *const *src, uint8_t *const *dst, int64_t deadline, size_t begin,
                 size_t end) {
  uint64_t since_check = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint8_t *s = src[plan.src_tensors[i]];
    uint8_t *d = dst[plan.dst_tensors[i]];
    for (const Segment &g : plan.segs) {
      for (uint64_t off = 0; off < g.len;) {
        if (deadline != 0 && since_check >= kDeadlineCheckBytes) {
          if (NowNs() > deadline) return LLM_TIMEOUT;
          since_check = 0;
        }
        const uint64_t n = std::min(g.len - off, kDeadlineCheckBytes);
        memcpy(d + g.dst_off + off, s + g.src_off + off, n);
        off += n;
        since_check += n;
      }
      since_check += 64;  // a segment costs something even when tiny
    }
  }
  return LLM_SUCCESS;
}

Status CopyPlan(const Plan &plan, uint8_t *const *src, uint8_t *const *dst, int64_t deadline) {
  return RunSplit(plan, [&](size_t b, size_t e) { return CopyRange(plan, src, dst, deadline, b, e); });
}

namespace {

class MemoryPath : public Path {
 public:
  MemoryPath(const char *name, std::vector<uint8_t *> remote, std::shared_ptr<SharedRegion> keep)
      : name_(name), remote_(std::move(remote)), keep_(std::move(keep)) {}
  const char *name() const override { return name_; }
  Status Execute(const Plan &plan, const CacheEntry &local, bool pull, int64_t deadline) override {
    uint8_t *const *loc = reinterpret_cast<uint8_t *const *>(local.addrs.data());
    return pull ? CopyPlan(plan, remote_.data(), loc, deadline) : CopyPlan(plan, loc, remote_.data(), deadline);
  }

 private:
  const char *name_;
  std::vector<uint8_t *> remote_;
  std::shared_ptr<SharedRegion> keep_;
};

}  // namespace

std::unique_ptr<Path> MakeMemoryPath(const char *name, std::vector<uint8_t *> remote_tensors,
                                     std::shared_ptr<SharedRegion> keep) {
  return std::unique_ptr<Path>(new MemoryPath(name, std::move(remote_tensors), std::move(keep)));
}

}  // namespace kvblocks
