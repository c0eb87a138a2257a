// SPDX-License-Identifier: Apache-2.0
// kvblocks.Integrity=crc32c on the served data path: a request's data stream with a CRC32C per
// (tensor, range) pair, in the CRC blocks of docs/protocol.md ("Integrity"). The side that reads the
// source memory computes, the side that writes the destination checks, each on chunks of the stream
// as they are sent or land (still in cache), never in a second pass.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_CHECKED_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_CHECKED_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>

#include "net/socket.h"

namespace kvblocks {

struct PeerLink;

// A request's (tensor, range) pairs in stream order (tensor-major), as this side's memory.
struct PairList {
  size_t count = 0;
  std::function<iovec(size_t)> at;  // pair i: its bytes here
};

constexpr uint64_t kNoMismatch = ~uint64_t{0};

// Sends `head` (frame header, request, padding: may be empty) and then every pair's bytes with the
// CRC blocks, computing each CRC on the chunk about to be sent.
IoResult SendChecked(int fd, iovec *head, size_t nhead, const PairList &pairs, int64_t deadline);

// Reads one iovec list completely (RecvIov on a socket, RecvBuffer::ReadIov on a serving channel).
using ReadIovFn = std::function<IoResult(iovec *iov, size_t n)>;
// Reads `head` (padding: may be empty), every pair's bytes into place and the CRC blocks, checking
// each chunk as it lands. The whole stream is read even after a mismatch, so the channel stays in
// step; *bad is then the first pair that differed, else kNoMismatch.
IoResult RecvChecked(const ReadIovFn &read, iovec *head, size_t nhead, const PairList &pairs, uint64_t *bad);

// The one place a CRC mismatch is noted, on the side that detected it (`served`: we served the
// request, a push into our memory; else our own pull). Metrics hook in here.
void NoteCrcMismatch(const PeerLink *link, bool served);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_CHECKED_H_
