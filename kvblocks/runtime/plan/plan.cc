// SPDX-License-Identifier: Apache-2.0
#include "plan/plan.h"

#include <algorithm>
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
  if (!sorted) {  // LSD radix sort of (key, index), 16 bits a pass, passes where every key agrees skipped
    std::vector<std::pair<uint64_t, uint32_t>> a(n), b(n);
    for (size_t i = 0; i < n; ++i) a[i] = {key(i), static_cast<uint32_t>(i)};
    std::vector<size_t> count(1 << 16);
    for (int shift = 0; shift < 64; shift += 16) {
      std::fill(count.begin(), count.end(), 0);
      for (const auto &e : a) ++count[(e.first >> shift) & 0xFFFF];
      if (count[(a[0].first >> shift) & 0xFFFF] == n) continue;
      size_t sum = 0;
      for (size_t &c : count) sum += std::exchange(c, sum);
      for (const auto &e : a) b[count[(e.first >> shift) & 0xFFFF]++] = e;
      a.swap(b);
    }
    for (size_t i = 0; i < n; ++i) order_[i] = a[i].second;
  }
  order_by_ = by_src ? 1 : 0;
  return order_;
}

}  // namespace kvblocks
