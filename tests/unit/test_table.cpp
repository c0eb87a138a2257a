// SPDX-License-Identifier: Apache-2.0
// The cache table (kvblocks/runtime/wire/table.*): what a peer announces at link time. Consistent
// entries round-trip; an entry whose sizes, descriptors or counts do not add up is refused, and so is
// a table past its bounds, before it is kept.
#include <string>
#include <vector>

#include "wire/table.h"
#include "common/limits.h"
#include "unit.h"
#include "wire/codec.h"

using namespace kvblocks;  // NOLINT: test code
using unit::Rand;

namespace {

TableEntry Good() {
  TableEntry c;
  c.id = 7;
  c.num_tensors = 4;
  c.stride = 4096;
  c.num_blocks = 16;
  c.tensor_bytes = 16 * 4096;
  c.has_memfd = true;
  c.memfd = MemfdDesc{3, 11, 12, 4 * 16 * 4096, 16 * 4096};
  c.addrs = {0x1000, 0x2000, 0x3000, 0x4000};
  return c;
}

bool RoundTrips(const std::vector<TableEntry> &in, std::vector<TableEntry> *out) {
  Writer w;
  EncodeTable(in, &w);
  Reader r(w.buf);
  return DecodeTable(&r, out) && r.done();
}

}  // namespace

TEST(table_consistent_entries_round_trip) {
  std::vector<TableEntry> in{Good()}, out;
  in.push_back(Good());
  in[1].id = 8;
  in[1].has_memfd = false;
  in[1].addrs.clear();
  in[1].batch_size = 2;
  in[1].batch_keys = {5, -1};
  CHECK(RoundTrips(in, &out));
  CHECK(out.size() == 2);
  CHECK(out[0].id == 7 && out[0].has_memfd && out[0].memfd.pitch == 16 * 4096 && out[0].addrs == in[0].addrs);
  CHECK(out[1].id == 8 && !out[1].has_memfd && out[1].addrs.empty() && out[1].batch_keys == in[1].batch_keys);
}

TEST(table_inconsistent_entries_are_refused) {
  std::vector<TableEntry> out;
  auto refused = [&](void (*spoil)(TableEntry *)) {
    TableEntry c = Good();
    spoil(&c);
    out.clear();
    return !RoundTrips({c}, &out);
  };
  CHECK(refused([](TableEntry *c) { c->num_tensors = 0; }));
  CHECK(refused([](TableEntry *c) { c->stride = 0; }));
  CHECK(refused([](TableEntry *c) { c->num_blocks = 17; }));                       // blocks past the tensor
  CHECK(refused([](TableEntry *c) { c->num_blocks = 1ULL << 62; }));              // overflowing span
  CHECK(refused([](TableEntry *c) { c->memfd.pitch = c->tensor_bytes - 1; }));     // tensors overlap
  CHECK(refused([](TableEntry *c) { c->memfd.region_size -= 1; }));                // last tensor outside
  CHECK(refused([](TableEntry *c) { c->memfd.fd = -1; }));
  CHECK(refused([](TableEntry *c) { c->addrs.pop_back(); }));                      // one address short
  CHECK(refused([](TableEntry *c) { c->batch_size = 1, c->batch_keys = {1, 2}; }));  // keys past batches
  CHECK(refused([](TableEntry *c) { c->num_tensors = kMaxTableTensors + 1; }));
}

TEST(table_unknown_descriptors_are_skipped) {
  Writer w;
  w.Put<uint32_t>(1);
  w.Put<int64_t>(9);
  w.Put<uint8_t>(0);
  w.Put<int64_t>(-1);
  w.Put<uint32_t>(1);
  w.Put<uint64_t>(4096);
  w.Put<uint64_t>(1);
  w.Put<uint64_t>(0);
  w.Put<uint64_t>(4096);
  w.Put<uint16_t>(2);
  for (uint8_t kind : {uint8_t{4}, uint8_t{200}}) {  // 4: retired UCX descriptor; 200: a future one
    w.Put<uint8_t>(kind);
    w.Put<uint32_t>(3);
    w.PutBytes("xyz", 3);
  }
  Reader r(w.buf);
  std::vector<TableEntry> out;
  CHECK(DecodeTable(&r, &out) && r.done());
  CHECK(out.size() == 1 && out[0].id == 9 && !out[0].has_memfd && out[0].addrs.empty());
}

TEST(table_bounds_refuse_before_keeping) {
  Writer w;
  w.Put<uint32_t>(kMaxLinkCaches + 1);  // more entries than a link may keep: refused at the count
  Reader r(w.buf);
  std::vector<TableEntry> out;
  CHECK(!DecodeTable(&r, &out) && out.empty());

  std::vector<TableEntry> big;  // kMaxLinkTableBytes of footprint: refused part way, never all kept
  TableEntry c = Good();
  c.has_memfd = false;
  c.num_tensors = 1 << 14;
  c.addrs.assign(c.num_tensors, 0x1000);
  for (int i = 0; TableFootprint(c) * i <= kMaxLinkTableBytes; ++i) {
    c.id = i + 1;
    big.push_back(c);
  }
  out.clear();
  CHECK(!RoundTrips(big, &out));
  CHECK(big.size() <= kMaxLinkCaches);
}

TEST(table_truncations_and_corruption_never_crash) {
  std::vector<TableEntry> in{Good(), Good()};
  in[1].id = 2;
  Writer w;
  EncodeTable(in, &w);
  for (size_t len = 0; len < w.buf.size(); ++len) {
    Reader r(reinterpret_cast<const uint8_t *>(w.buf.data()), len);
    std::vector<TableEntry> out;
    CHECK(!DecodeTable(&r, &out) || !r.done());
  }
  for (int k = 0; k < 2000; ++k) {
    std::string bad = w.buf;
    bad[Rand(bad.size())] ^= static_cast<char>(1 + Rand(255));
    Reader r(bad);
    std::vector<TableEntry> out;
    DecodeTable(&r, &out);  // any verdict; ASan/UBSan (the sanitizer CI run) watch the reads
    CHECK(out.size() <= 2);
  }
}
