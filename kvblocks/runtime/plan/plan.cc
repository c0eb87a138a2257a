// SPDX-License-Identifier: Apache-2.0
// The plan builders (plan/plan.h); the type and what paths read of it: transport/plan.h.
#include "plan/plan.h"

#include <cstddef>

namespace kvblocks {

void Plan::PairTensors(uint32_t src_begin, uint32_t dst_begin, uint32_t count) {
  src_tensors.resize(count);
  dst_tensors.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    src_tensors[i] = src_begin + i;
    dst_tensors[i] = dst_begin + i;
  }
}

void Plan::AddBlocks(const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst, uint64_t block_bytes) {
  const size_t n = src.size();
  segs.reserve(segs.size() + n);  // upper bound; untouched pages cost nothing
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    while (j < n && src[j] == src[j - 1] + 1 && dst[j] == dst[j - 1] + 1) ++j;
    AddRange(src[i] * block_bytes, dst[i] * block_bytes, (j - i) * block_bytes);
    i = j;
  }
}

}  // namespace kvblocks
