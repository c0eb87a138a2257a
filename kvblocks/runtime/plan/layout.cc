// SPDX-License-Identifier: Apache-2.0
#include "plan/layout.h"

#include <algorithm>
#include <cstdio>

namespace kvblocks {

namespace {

std::string Say(const char *fmt, unsigned long long a, unsigned long long b = 0, unsigned long long c = 0,
                unsigned long long d = 0, unsigned long long e = 0) {
  char buf[256];
  snprintf(buf, sizeof(buf), fmt, a, b, c, d, e);
  return buf;
}

uint32_t Heads(const LayoutTransform &x) { return x.num_heads ? x.num_heads : x.src.kv_heads - x.src_head_begin; }

// Bytes of one block of `l`, or 0 when a field is 0 or the product overflows.
uint64_t BlockBytes(const BlockLayout &l) {
  uint64_t b = 1;
  for (uint64_t f : {l.tokens_per_block, l.kv_heads, l.head_size, l.elem_size})
    if (f == 0 || __builtin_mul_overflow(b, f, &b)) return 0;
  return b;
}

std::string CheckSide(const char *side, const BlockLayout &l, uint64_t block_bytes) {
  const uint64_t b = BlockBytes(l);
  if (b == 0)
    return std::string(side) + " layout: tokens_per_block, kv_heads, head_size and elem_size must be > 0 (and their "
           "product fit 64 bits)";
  if (b != block_bytes)
    return std::string(side) + Say(" layout describes %llu-byte blocks (%llu tokens x %llu heads x %llu x %llu bytes); "
           "the cache's blocks are ", b, l.tokens_per_block, l.kv_heads, l.head_size, l.elem_size) +
           Say("%llu bytes", block_bytes);
  return "";
}

}  // namespace

std::string CheckLayout(const LayoutTransform &x, uint64_t src_block_bytes, uint64_t dst_block_bytes, size_t ns,
                        size_t nd) {
  std::string why = CheckSide("src", x.src, src_block_bytes);
  if (why.empty()) why = CheckSide("dst", x.dst, dst_block_bytes);
  if (!why.empty()) return why;
  if (x.src.head_size != x.dst.head_size || x.src.elem_size != x.dst.elem_size)
    return Say("head_size %llu x elem_size %llu of src differs from head_size %llu x elem_size %llu of dst",
               x.src.head_size, x.src.elem_size, x.dst.head_size, x.dst.elem_size);
  if (x.src_head_begin >= x.src.kv_heads)
    return Say("src_head_begin=%llu is out of range for %llu src heads", x.src_head_begin, x.src.kv_heads);
  const uint64_t n = Heads(x);
  if (uint64_t{x.src_head_begin} + n > x.src.kv_heads || uint64_t{x.dst_head_begin} + n > x.dst.kv_heads)
    return Say("heads [%llu, +%llu) of %llu src heads into [%llu, +%llu) do not fit", x.src_head_begin, n,
               x.src.kv_heads, x.dst_head_begin, n) + Say(" the %llu dst heads", x.dst.kv_heads);
  if (ns == 0 || nd == 0) return ns == 0 ? "src_blocks is empty" : "dst_blocks is empty";
  unsigned __int128 st = static_cast<unsigned __int128>(ns) * x.src.tokens_per_block;
  unsigned __int128 dt = static_cast<unsigned __int128>(nd) * x.dst.tokens_per_block;
  if (st != dt)
    return Say("%llu src blocks of %llu tokens (%llu) do not tile %llu dst blocks of ", ns, x.src.tokens_per_block,
               static_cast<unsigned long long>(st), nd) +
           Say("%llu tokens (%llu)", x.dst.tokens_per_block, static_cast<unsigned long long>(dt));
  return "";
}

namespace {

// Appends a range, extending the last one when it continues it on both sides.
inline void Put(Plan *p, uint64_t s, uint64_t d, uint64_t len) {
  if (!p->segs.empty()) {
    Segment &g = p->segs.back();
    if (g.src_off + g.len == s && g.dst_off + g.len == d) {
      g.len += len;
      p->bytes_per_tensor += len;
      return;
    }
  }
  p->AddRange(s, d, len);
}

struct Side {
  uint64_t tokens, heads, block_bytes, chunk;
  bool hnd;
  explicit Side(const BlockLayout &l)
      : tokens(l.tokens_per_block), heads(l.kv_heads), block_bytes(BlockBytes(l)),
        chunk(uint64_t{l.head_size} * l.elem_size), hnd(l.hnd) {}
  // Byte offset of (token t, head h) in block b.
  uint64_t At(uint64_t b, uint64_t t, uint64_t h) const {
    return b * block_bytes + (hnd ? h * tokens + t : t * heads + h) * chunk;
  }
};

}  // namespace

void AddLayoutBlocks(const LayoutTransform &x, const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst,
                     Plan *plan) {
  const Side S(x.src), D(x.dst);
  const uint64_t n = Heads(x), a = x.src_head_begin, c = x.dst_head_begin, cb = S.chunk;
  // At most one range per (token, head) of the destination, fewer where ranges merge.
  const uint64_t per_block = D.hnd ? n * D.tokens : D.tokens * (S.hnd ? n : 1);
  plan->segs.reserve(plan->segs.size() + dst.size() * per_block);
  for (size_t j = 0; j < dst.size(); ++j) {
    // The block's first token in the stream, as (source list index, token): one division per block,
    // then stepped (two 64-bit divisions per range were most of a large plan's build time).
    const uint64_t first = j * D.tokens;
    const size_t sb0 = static_cast<size_t>(first / S.tokens);
    const uint64_t st0 = first % S.tokens;
    if (!D.hnd) {
      size_t si = sb0;
      uint64_t st = st0;
      for (uint64_t t = 0; t < D.tokens; ++t) {
        const uint64_t sb = src[si];
        if (!S.hnd) {  // heads [a, a+n) of a token are contiguous on both sides
          Put(plan, S.At(sb, st, a), D.At(dst[j], t, c), n * cb);
        } else {
          for (uint64_t h = 0; h < n; ++h) Put(plan, S.At(sb, st, a + h), D.At(dst[j], t, c + h), cb);
        }
        if (++st == S.tokens) st = 0, ++si;
      }
      continue;
    }
    for (uint64_t h = 0; h < n; ++h) {
      size_t si = sb0;
      uint64_t st = st0;
      for (uint64_t t = 0; t < D.tokens;) {
        // HND on both sides: a head's tokens are contiguous up to the end of either block.
        const uint64_t run = S.hnd ? std::min(D.tokens - t, S.tokens - st) : 1;
        Put(plan, S.At(src[si], st, a + h), D.At(dst[j], t, c + h), run * cb);
        t += run;
        st += run;
        if (st == S.tokens) st = 0, ++si;
      }
    }
  }
}

}  // namespace kvblocks
