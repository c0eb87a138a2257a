// SPDX-License-Identifier: Apache-2.0
// memcpy between this process's memory and memory it can address directly: another engine of
// this process, or a same-host peer's memfd mapped here.
#include <cstring>

#include "common/limits.h"
#include "common/util.h"
#include "transport/path.h"
#include "transport/copy_pool.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

// memcpy chunk by chunk (transport/copy_pool.h); the clock is read before every chunk but the
// first, so a deadline is kept to within one chunk (about 0.1-0.3 ms of memcpy). A plan of one
// chunk (every small call) is copied in place, without cutting it or handing it to the pool.
Status CopyPlan(const Plan &plan, uint8_t *const *src, uint8_t *const *dst, int64_t deadline) {
  if (plan.total_bytes() <= kDeadlineCheckBytes) {
    for (size_t i = 0; i < plan.src_tensors.size(); ++i) {
      uint8_t *const s = src[plan.src_tensors[i]], *const d = dst[plan.dst_tensors[i]];
      for (const Segment &g : plan.segs) memcpy(d + g.dst_off, s + g.src_off, g.len);
    }
    return LLM_SUCCESS;
  }
  const Chunking chunks(plan, kDeadlineCheckBytes);
  auto copy = [&](size_t c) -> Status {
    if (deadline != 0 && c != 0 && NowNs() > deadline) return LLM_TIMEOUT;
    chunks.ForEach(c, [&](size_t i, const Segment &g) {
      memcpy(dst[plan.dst_tensors[i]] + g.dst_off, src[plan.src_tensors[i]] + g.src_off, g.len);
    });
    return LLM_SUCCESS;
  };
  return RunChunks(chunks.count(), plan.total_bytes(), copy);
}

namespace {

class MemoryPath : public Path {
 public:
  MemoryPath(const char *name, std::vector<uint8_t *> remote, std::shared_ptr<SharedRegion> keep)
      : name_(name), remote_(std::move(remote)), keep_(std::move(keep)) {}
  const char *name() const override { return name_; }
  PathMode mode() const override { return PathMode::kLocalCopy; }
  Status Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) override {
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
