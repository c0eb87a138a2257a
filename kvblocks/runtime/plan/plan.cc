// SPDX-License-Identifier: Apache-2.0
#include "plan/plan.h"

#include <algorithm>
#include <array>
#include <utility>

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

void Plan::AddRange(uint64_t src_off, uint64_t dst_off, uint64_t len) {
  segs.push_back(Segment{src_off, dst_off, len});
  bytes_per_tensor += len;
  order_by_ = -1;
}

const std::vector<uint32_t> &Plan::Order(bool by_src) const {
  if (order_by_ == (by_src ? 1 : 0) && order_.size() == segs.size()) return order_;
  const size_t n = segs.size();
  auto key = [&](size_t i) { return by_src ? segs[i].src_off : segs[i].dst_off; };
  order_.resize(n);
  bool sorted = true;
  for (size_t i = 0; i < n; ++i) {
    order_[i] = static_cast<uint32_t>(i);
    if (i > 0 && key(i) < key(i - 1)) sorted = false;
  }
  if (!sorted) {
    // LSD radix sort of (key, index), 8 bits a pass: 256 counters stay in L1 (16-bit digits missed
    // the cache on every element, 30-50 ms for 256K ranges). All eight histograms come from one
    // read; a digit every key shares (offsets are often multiples of 256) costs no pass.
    std::vector<std::pair<uint64_t, uint32_t>> a(n), b(n);
    std::vector<std::array<size_t, 256>> count(8, std::array<size_t, 256>{});
    for (size_t i = 0; i < n; ++i) {
      a[i] = {key(i), static_cast<uint32_t>(i)};
      for (int d = 0; d < 8; ++d) ++count[d][(a[i].first >> (8 * d)) & 0xFF];
    }
    for (int d = 0; d < 8; ++d) {
      const int shift = 8 * d;
      if (count[d][(a[0].first >> shift) & 0xFF] == n) continue;
      size_t sum = 0;
      for (size_t &c : count[d]) sum += std::exchange(c, sum);
      for (const auto &e : a) b[count[d][(e.first >> shift) & 0xFF]++] = e;
      a.swap(b);
    }
    for (size_t i = 0; i < n; ++i) order_[i] = a[i].second;
  }
  order_by_ = by_src ? 1 : 0;
  return order_;
}

}  // namespace kvblocks
