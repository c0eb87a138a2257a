// SPDX-License-Identifier: Apache-2.0
// Plan (kvblocks/runtime/plan/): block lists become maximal runs of byte segments that move exactly
// the bytes a block-by-block reference moves, in order.
#include <algorithm>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "unit.h"

using namespace kvblocks;  // NOLINT: test code
using unit::Rand;

namespace {

// The (src byte, dst byte) of every byte the plan moves in one tensor pair, in plan order.
std::vector<std::pair<uint64_t, uint64_t>> Bytes(const Plan &p) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const Segment &s : p.segs)
    for (uint64_t i = 0; i < s.len; ++i) out.emplace_back(s.src_off + i, s.dst_off + i);
  return out;
}

}  // namespace

TEST(plan_runs_move_exactly_the_listed_blocks) {
  for (int round = 0; round < 500; ++round) {
    const uint64_t bb = 1 + Rand(16), n = Rand(40), space = 1 + Rand(64);
    std::vector<uint64_t> src(n), dst(n);
    for (uint64_t i = 0; i < n; ++i) {
      // Mostly consecutive runs, sometimes a jump, so both merging and splitting happen.
      src[i] = i && Rand(4) ? src[i - 1] + 1 : Rand(space);
      dst[i] = i && Rand(4) ? dst[i - 1] + 1 : Rand(space);
    }
    Plan p;
    p.AddBlocks(src, dst, bb);
    std::vector<std::pair<uint64_t, uint64_t>> want;
    for (uint64_t i = 0; i < n; ++i)
      for (uint64_t b = 0; b < bb; ++b) want.emplace_back(src[i] * bb + b, dst[i] * bb + b);
    CHECK(Bytes(p) == want);
    CHECK(p.bytes_per_tensor == n * bb);
    for (size_t i = 1; i < p.segs.size(); ++i) {  // maximal: no two neighbours continue each other
      const Segment &a = p.segs[i - 1], &b = p.segs[i];
      CHECK(!(b.src_off == a.src_off + a.len && b.dst_off == a.dst_off + a.len));
    }
  }
}

TEST(plan_consecutive_blocks_are_one_segment) {
  Plan p;
  p.AddBlocks({0, 1, 2, 3}, {4, 5, 6, 7}, 4096);
  CHECK(p.segs.size() == 1);
  CHECK(p.segs[0].src_off == 0 && p.segs[0].dst_off == 4 * 4096 && p.segs[0].len == 4 * 4096);
  Plan q;
  q.AddBlocks({1, 3, 5, 7}, {0, 2, 4, 6}, 64);
  CHECK(q.segs.size() == 4 && q.bytes_per_tensor == 4 * 64);
}

TEST(plan_pairs_tensors_and_counts_total_bytes) {
  Plan p;
  p.PairTensors(6, 2, 3);
  CHECK((p.src_tensors == std::vector<uint32_t>{6, 7, 8}));
  CHECK((p.dst_tensors == std::vector<uint32_t>{2, 3, 4}));
  p.AddRange(0, 100, 10);
  p.AddRange(50, 0, 5);
  CHECK(p.bytes_per_tensor == 15 && p.total_bytes() == 45);
}

// Plan::Order (the remote-side order the cma and tcp paths use for small ranges) is a stable sort
// by offset: wide keys (past 2^32, so the radix sort's upper passes run), ties in plan order, and
// forgotten when a range is added.
TEST(plan_order_is_a_stable_sort_by_offset) {
  for (int round = 0; round < 300; ++round) {
    Plan p;
    const uint64_t n = Rand(300), wide = Rand(2) ? (1ULL << 40) : 64;
    for (uint64_t i = 0; i < n; ++i) p.AddRange(Rand(wide) * (1 + Rand(3)), Rand(wide), 1 + Rand(8));
    for (bool by_src : {true, false}) {
      std::vector<uint32_t> want(n);
      for (uint32_t i = 0; i < n; ++i) want[i] = i;
      auto key = [&](uint32_t i) { return by_src ? p.segs[i].src_off : p.segs[i].dst_off; };
      std::stable_sort(want.begin(), want.end(), [&](uint32_t x, uint32_t y) { return key(x) < key(y); });
      CHECK(p.Order(by_src) == want);
    }
  }
  Plan p;
  p.AddRange(8, 0, 1);
  p.AddRange(4, 1, 1);
  CHECK((p.Order(true) == std::vector<uint32_t>{1, 0}));
  p.AddRange(0, 2, 1);
  CHECK((p.Order(true) == std::vector<uint32_t>{2, 1, 0}));  // the new range is taken in
}
