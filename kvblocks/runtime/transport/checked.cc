// SPDX-License-Identifier: Apache-2.0
#include "transport/checked.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "security/crc32c.h"
#include "transport/peer.h"
#include "wire/codec.h"

namespace kvblocks {
namespace {

// Bytes checked, then moved, per socket call batch: small enough to still be in the core's L2
// between the CRC and the kernel's copy (512 KiB on AMD Zen 3; 256 KiB batches took the sender 66 ms
// per 256 MiB here, 1 MiB ones 70-71, 64 KiB ones 77-78: more sendmsg calls), large enough to keep
// sendmsg calls full. A receive batch is larger: SO_RCVLOWAT (net/socket.cc) wakes the reader once
// per 2 MiB only for receives of 4 MiB or more, which is worth more than L2 (the CRC then reads from L3).
constexpr uint64_t kSendBatch = 256ULL << 10;
constexpr uint64_t kRecvBatch = 4ULL << 20;

// One group of pairs [begin, end): its CRC block's storage (and padding, zero).
struct Block {
  uint32_t crc[kCrcGroupPairs + kDataAlign / 4] = {};
  size_t Bytes(size_t pairs) const { return static_cast<size_t>(CrcBlockBytes(pairs)); }
};

// Walks the pairs of a stream in batches of about `batch` bytes (cutting large pairs) into `iov`,
// calling `chunk(pair, p, n, first)` for each piece (`first`: the pair's first piece) and
// `flush(group_end, g, end)` for each batch; `group_end`: the batch ends group [g, end), and the
// caller appends its CRC block.
template <typename Chunk, typename Flush>
IoResult Walk(const PairList &pairs, uint64_t batch, std::vector<iovec> *iov, Chunk &&chunk, Flush &&flush) {
  uint64_t in_batch = 0;
  for (size_t g = 0; g < pairs.count; g += kCrcGroupPairs) {
    const size_t end = std::min<size_t>(pairs.count, g + kCrcGroupPairs);
    for (size_t i = g; i < end; ++i) {
      const iovec v = pairs.at(i);
      uint8_t *p = static_cast<uint8_t *>(v.iov_base);
      size_t off = 0, left = v.iov_len;
      do {  // at least once: an empty pair still has its CRC
        const size_t k = static_cast<size_t>(std::min<uint64_t>(left, batch - in_batch));
        chunk(i, p + off, k, off == 0);
        AppendIov(iov, p + off, k);
        off += k;
        left -= k;
        if ((in_batch += k) >= batch || iov->size() >= IOV_MAX) {
          const IoResult r = flush(false, g, end);
          if (r != IoResult::kOk) return r;
          in_batch = 0;
        }
      } while (left > 0);
    }
    const IoResult r = flush(true, g, end);
    if (r != IoResult::kOk) return r;
    in_batch = 0;
  }
  return pairs.count == 0 ? flush(true, 0, 0) : IoResult::kOk;
}

}  // namespace

IoResult SendChecked(int fd, iovec *head, size_t nhead, const PairList &pairs, int64_t deadline) {
  std::vector<iovec> iov(head, head + nhead);
  Block block;
  uint32_t crc = 0;
  // The CRC of each piece is taken just before its batch goes out, while it is in cache.
  auto chunk = [&](size_t i, const uint8_t *p, size_t n, bool first) {
    crc = Crc32c(first ? 0 : crc, p, n);
    block.crc[i % kCrcGroupPairs] = ToLittle(crc);
  };
  auto flush = [&](bool group_end, size_t g, size_t end) {
    if (group_end) {
      const size_t bytes = block.Bytes(end - g);
      memset(reinterpret_cast<uint8_t *>(block.crc) + 4 * (end - g), 0, bytes - 4 * (end - g));
      iov.push_back(iovec{block.crc, bytes});
    }
    const IoResult r = iov.empty() ? IoResult::kOk : SendIov(fd, iov.data(), iov.size(), deadline);
    iov.clear();
    return r;
  };
  return Walk(pairs, kSendBatch, &iov, chunk, flush);
}

IoResult RecvChecked(const ReadIovFn &read, iovec *head, size_t nhead, const PairList &pairs, uint64_t *bad) {
  *bad = kNoMismatch;
  std::vector<iovec> iov(head, head + nhead);
  struct Piece {
    const uint8_t *p;
    size_t n, pair;
    bool first;
  };
  std::vector<Piece> landed;  // this batch's pieces, checked once read
  Block got;
  uint32_t mine[kCrcGroupPairs] = {};
  auto chunk = [&](size_t i, const uint8_t *p, size_t n, bool first) { landed.push_back(Piece{p, n, i, first}); };
  auto flush = [&](bool group_end, size_t g, size_t end) {
    if (group_end) iov.push_back(iovec{got.crc, got.Bytes(end - g)});
    const IoResult r = iov.empty() ? IoResult::kOk : read(iov.data(), iov.size());
    iov.clear();
    if (r != IoResult::kOk) return r;
    // The batch has just landed: check it while it is in cache. A pair's first piece restarts it.
    for (const Piece &k : landed) {
      uint32_t &c = mine[k.pair % kCrcGroupPairs];
      c = Crc32c(k.first ? 0 : c, k.p, k.n);
    }
    landed.clear();
    if (group_end)
      for (size_t i = g; i < end && *bad == kNoMismatch; ++i)
        if (ToLittle(got.crc[i - g]) != mine[i - g]) *bad = i;
    return IoResult::kOk;
  };
  return Walk(pairs, kRecvBatch, &iov, chunk, flush);
}

void NoteCrcMismatch(const PeerLink *link, bool) {
  // The caller has already set the call's error message; this counts it for the operator.
  if (link != nullptr && link->stats) metrics::Add(link->stats->crc_mismatches);
}

}  // namespace kvblocks
