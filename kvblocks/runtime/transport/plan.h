// SPDX-License-Identifier: Apache-2.0
// A transfer plan, the data type every path executes: which tensor pairs, and which byte ranges of
// each, move. plan/ builds it (plan/plan.h: once per call, after every check passed); the pairing
// and block-merging builders are defined there (plan/plan.cc), what paths read here.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_PLAN_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvblocks {

// Ranges averaging under this many bytes make a plan of small ranges (Plan::SmallRanges): the
// per-range cost of process_vm_readv (page pinning) and of the kernel's socket copies dominates it.
constexpr uint64_t kSmallRangeBytes = 4096;

struct Segment {
  uint64_t src_off, dst_off, len;
};

struct Plan {
  std::vector<uint32_t> src_tensors, dst_tensors;  // paired tensor indices
  std::vector<Segment> segs;                       // the same byte ranges in every tensor pair
  uint64_t bytes_per_tensor = 0;
  uint64_t total_bytes() const { return bytes_per_tensor * src_tensors.size(); }
  // Builders (plan/plan.cc). Pairs tensors [src_begin, src_begin + count) with [dst_begin, dst_begin + count).
  void PairTensors(uint32_t src_begin, uint32_t dst_begin, uint32_t count);
  // Merges consecutive (src, dst) block pairs into runs and appends them as byte segments.
  void AddBlocks(const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst, uint64_t block_bytes);
  void AddRange(uint64_t src_off, uint64_t dst_off, uint64_t len) {
    segs.push_back(Segment{src_off, dst_off, len});
    bytes_per_tensor += len;
    order_by_ = -1;
  }
  // Indices of segs by ascending source (by_src) or destination offset, for paths that pay per
  // range on one side and merge ranges adjacent there. Sorted at first use and kept with the plan
  // (a prepared plan sorts once); AddRange forgets it. Call it before the plan is shared between
  // threads; segs must hold fewer than 2^32 entries.
  const std::vector<uint32_t> &Order(bool by_src) const;
  // More than one range, averaging under kSmallRangeBytes (and few enough for Order).
  bool SmallRanges() const {
    return segs.size() > 1 && segs.size() < (1ULL << 32) && bytes_per_tensor < kSmallRangeBytes * segs.size();
  }

 private:
  mutable std::vector<uint32_t> order_;
  mutable int order_by_ = -1;  // -1: none; 1: order_ is by source; 0: by destination
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_PLAN_H_
