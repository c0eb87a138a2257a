// SPDX-License-Identifier: Apache-2.0
// Layout transforms (plan/layout.h): the compiled ranges move every byte of the transform's reference,
// (src byte -> dst byte) computed one element at a time from the layouts' definitions, and nothing else.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "plan/layout.h"
#include "unit.h"

using namespace kvblocks;  // NOLINT: test code
using unit::Rand;

namespace {

uint64_t At(const BlockLayout &l, uint64_t block, uint64_t t, uint64_t h, uint64_t byte) {
  const uint64_t chunk = uint64_t{l.head_size} * l.elem_size;
  const uint64_t bb = l.tokens_per_block * l.kv_heads * chunk;
  return block * bb + (l.hnd ? h * l.tokens_per_block + t : t * l.kv_heads + h) * chunk + byte;
}

BlockLayout Random(uint32_t chunk_elems, uint32_t elem) {
  BlockLayout l;
  l.tokens_per_block = 1 + Rand(6);
  l.kv_heads = 1 + Rand(5);
  l.head_size = chunk_elems;
  l.elem_size = elem;
  l.hnd = Rand(2) != 0;
  return l;
}

uint64_t Bytes(const BlockLayout &l) { return uint64_t{l.tokens_per_block} * l.kv_heads * l.head_size * l.elem_size; }

}  // namespace

TEST(layout_ranges_move_exactly_the_reference_bytes) {
  for (int round = 0; round < 400; ++round) {
    LayoutTransform x;
    const uint32_t d = 1 + Rand(4), e = 1 + Rand(2);
    x.src = Random(d, e);
    x.dst = Random(d, e);
    const uint32_t n = 1 + Rand(std::min(x.src.kv_heads, x.dst.kv_heads));
    x.src_head_begin = Rand(x.src.kv_heads - n + 1);
    x.dst_head_begin = Rand(x.dst.kv_heads - n + 1);
    x.num_heads = n;
    const uint64_t tokens = x.src.tokens_per_block * x.dst.tokens_per_block * (1 + Rand(2));
    std::vector<uint64_t> src(tokens / x.src.tokens_per_block), dst(tokens / x.dst.tokens_per_block);
    for (auto &b : src) b = Rand(8);
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = i * 2 + Rand(2);  // distinct, ascending
    CHECK(CheckLayout(x, Bytes(x.src), Bytes(x.dst), src.size(), dst.size()).empty());
    Plan p;
    AddLayoutBlocks(x, src, dst, &p);
    std::map<uint64_t, uint64_t> want, got;  // dst byte -> src byte
    for (uint64_t k = 0; k < tokens; ++k)
      for (uint64_t h = 0; h < n; ++h)
        for (uint64_t b = 0; b < uint64_t{d} * e; ++b)
          want[At(x.dst, dst[k / x.dst.tokens_per_block], k % x.dst.tokens_per_block, x.dst_head_begin + h, b)] =
              At(x.src, src[k / x.src.tokens_per_block], k % x.src.tokens_per_block, x.src_head_begin + h, b);
    uint64_t moved = 0;
    for (const Segment &g : p.segs)
      for (uint64_t i = 0; i < g.len; ++i, ++moved) got[g.dst_off + i] = g.src_off + i;
    CHECK(got == want);
    CHECK(moved == want.size() && p.bytes_per_tensor == moved);  // no destination byte written twice
  }
}

TEST(layout_identity_is_one_range_per_run_of_blocks) {
  LayoutTransform x;
  x.src = x.dst = BlockLayout{16, 8, 128, 2, false};
  Plan p;
  AddLayoutBlocks(x, {0, 1, 2, 7}, {4, 5, 6, 9}, &p);
  CHECK(p.segs.size() == 2 && p.bytes_per_tensor == 4 * 16 * 8 * 256);
}

TEST(layout_checks_every_rule) {
  LayoutTransform x;
  x.src = BlockLayout{16, 8, 128, 2, false};
  x.dst = BlockLayout{32, 4, 128, 2, true};
  const uint64_t sb = 16 * 8 * 256, db = 32 * 4 * 256;
  x.num_heads = 4;
  CHECK(CheckLayout(x, sb, db, 2, 1).empty());
  CHECK(CheckLayout(x, sb, db, 3, 1).find("do not tile") != std::string::npos);
  CHECK(CheckLayout(x, sb + 1, db, 2, 1).find("src layout describes") != std::string::npos);
  CHECK(CheckLayout(x, sb, db / 2, 2, 1).find("dst layout describes") != std::string::npos);
  x.dst_head_begin = 1;
  CHECK(CheckLayout(x, sb, db, 2, 1).find("do not fit") != std::string::npos);
  x.dst_head_begin = 0;
  x.src_head_begin = 8;
  CHECK(CheckLayout(x, sb, db, 2, 1).find("out of range") != std::string::npos);
  x.src_head_begin = 0;
  x.dst.head_size = 64;
  x.dst.elem_size = 4;
  CHECK(CheckLayout(x, sb, db, 2, 1).find("differs") != std::string::npos);
  x.dst = BlockLayout{0, 4, 128, 2, true};
  CHECK(CheckLayout(x, sb, db, 2, 1).find("must be > 0") != std::string::npos);
  x.dst = BlockLayout{0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 2, true};  // the product overflows
  CHECK(CheckLayout(x, sb, db, 2, 1).find("must be > 0") != std::string::npos);
}
