// SPDX-License-Identifier: Apache-2.0
// What paths read of a plan (transport/plan.h); plan/plan.cc builds it.
#include "transport/plan.h"

#include <algorithm>
#include <array>
#include <utility>

namespace kvblocks {

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
