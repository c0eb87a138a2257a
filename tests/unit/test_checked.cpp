// SPDX-License-Identifier: Apache-2.0
// The checked data stream of kvblocks.Integrity=crc32c (transport/checked.h) over a real socket pair:
// its bytes are exactly the documented layout (docs/protocol.md, "Integrity"), it moves every pair,
// and a byte changed anywhere in flight (data or CRC block) names the first pair it hit.
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "common/util.h"
#include "net/socket.h"
#include "security/crc32c.h"
#include "transport/checked.h"
#include "unit.h"
#include "wire/messages.h"

using namespace kvblocks;  // NOLINT: test code
using unit::Rand;

namespace {

using Bufs = std::vector<std::vector<uint8_t>>;

PairList Over(Bufs *v) {
  PairList p;
  p.count = v->size();
  p.at = [v](size_t i) { return iovec{(*v)[i].data(), (*v)[i].size()}; };
  return p;
}

Bufs RandomPairs(size_t n, size_t most) {
  Bufs out(n);
  for (auto &b : out) {
    b.resize(1 + Rand(most));
    for (auto &x : b) x = static_cast<uint8_t>(Rand(256));
  }
  return out;
}

// What SendChecked writes, read off the far end of a socket pair.
std::string Sent(Bufs *src) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  uint64_t total = 0;
  for (auto &b : *src) total += b.size();
  const uint64_t want = total + CrcTrailerBytes(src->size());
  std::thread t([&] { CHECK(SendChecked(sv[0], nullptr, 0, Over(src), NowNs() + 20000000000LL) == IoResult::kOk); });
  std::string got(want, '\0');
  CHECK(RecvAll(sv[1], &got[0], got.size(), NowNs() + 20000000000LL) == IoResult::kOk);
  t.join();
  close(sv[0]);
  close(sv[1]);
  return got;
}

// RecvChecked of `stream` into buffers shaped like `src`; the first bad pair, or kNoMismatch.
uint64_t Received(const std::string &stream, const Bufs &src, Bufs *dst) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  dst->clear();
  for (const auto &b : src) dst->emplace_back(b.size());
  std::thread w([&] {
    iovec v{const_cast<char *>(stream.data()), stream.size()};
    CHECK(SendIov(sv[0], &v, 1, NowNs() + 20000000000LL) == IoResult::kOk);
  });
  uint64_t bad = 0;
  auto read = [&](iovec *v, size_t n) { return RecvIov(sv[1], v, n, NowNs() + 20000000000LL); };
  CHECK(RecvChecked(read, nullptr, 0, Over(dst), &bad) == IoResult::kOk);
  w.join();
  close(sv[0]);
  close(sv[1]);
  return bad;
}

// The documented layout: groups of kCrcGroupPairs pairs, each followed by its CRCs, the block zero-padded
// to a multiple of 64 bytes.
void CheckLayout(const std::string &s, const Bufs &src) {
  size_t off = 0;
  for (size_t g = 0; g < src.size(); g += kCrcGroupPairs) {
    const size_t end = std::min(src.size(), g + kCrcGroupPairs);
    for (size_t i = g; i < end; ++i) {
      CHECK(s.compare(off, src[i].size(), reinterpret_cast<const char *>(src[i].data()), src[i].size()) == 0);
      off += src[i].size();
    }
    const size_t block = off;
    for (size_t i = g; i < end; ++i, off += 4) {
      uint32_t c;
      memcpy(&c, s.data() + off, 4);
      CHECK(c == Crc32c(0, src[i].data(), src[i].size()));
    }
    for (; (off - block) % 64 != 0; ++off) CHECK(off < s.size() && s[off] == 0);  // the block's padding
  }
  CHECK(off == s.size());
}

}  // namespace

TEST(checked_stream_is_the_documented_layout_and_round_trips) {
  for (const size_t n : {size_t{1}, size_t{15}, size_t{1024}, size_t{1025}, size_t{3000}}) {
    Bufs src = RandomPairs(n, n > 1000 ? 3000 : 700000), dst;  // large pairs cross the send/recv batches
    const std::string s = Sent(&src);
    CheckLayout(s, src);
    CHECK(Received(s, src, &dst) == kNoMismatch);
    CHECK(dst == src);
  }
}

TEST(checked_stream_names_the_first_pair_a_changed_byte_hit) {
  Bufs src = RandomPairs(2100, 4000), dst;
  const std::string s = Sent(&src);
  for (int round = 0; round < 40; ++round) {
    std::string bad = s;
    const size_t at = Rand(bad.size());
    bad[at] ^= static_cast<char>(1 << Rand(8));
    // Which pair owns byte `at`: its data, or its slot in a CRC block (padding hits none).
    uint64_t want = kNoMismatch;
    size_t off = 0;
    for (size_t g = 0; g < src.size() && want == kNoMismatch; g += kCrcGroupPairs) {
      const size_t end = std::min(src.size(), g + kCrcGroupPairs);
      for (size_t i = g; i < end; off += src[i].size(), ++i)
        if (at >= off && at < off + src[i].size()) want = i;
      if (want == kNoMismatch && at >= off && at < off + 4 * (end - g)) want = g + (at - off) / 4;
      off += CrcBlockBytes(end - g);
    }
    CHECK(Received(bad, src, &dst) == want);
  }
}
