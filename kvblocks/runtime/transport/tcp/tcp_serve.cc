// SPDX-License-Identifier: Apache-2.0
// The serving side of a data channel. Runs on runtime threads only (never Python), and checks
// every request against this process's own cache table: a peer's offsets are never trusted.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/limits.h"
#include "common/util.h"
#include "net/socket.h"
#include "transport/checked.h"
#include "transport/path.h"
#include "transport/peer.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

struct Request {
  XferRequest wire;
  std::shared_ptr<LocalMemory> cache;
  int64_t deadline = 0;
  std::vector<uint8_t *> bases;  // one per requested tensor, in wire order
};

// Checks every range against our own table before anything is touched.
Status CheckRequest(Request *req, const LocalTable &caches) {
  const XferRequest &q = req->wire;
  // Two views of the requester's deadline, and the earlier wins: the absolute one (its clock plus
  // the offset measured at link time) still holds if we were frozen before reading this request;
  // the remaining budget, counted from now, does not drift however long the link has lived.
  if (q.deadline <= 0 || q.budget <= 0) return LLM_PARAM_INVALID;
  const int64_t now = NowNs();
  req->deadline = std::min({q.deadline, now + q.budget, now + kMaxServeNs});
  req->cache = caches.FindMemory(q.cache_id);
  if (!req->cache) return LLM_KV_CACHE_NOT_EXIST;
  const LocalMemory &c = *req->cache;
  if (q.tensors.empty() || q.tensors.size() > c.num_tensors || q.ranges.empty()) return LLM_PARAM_INVALID;
  uint64_t per_tensor = 0, end, total;
  for (const ByteRange &g : q.ranges) {
    if (g.length == 0 || __builtin_add_overflow(g.offset, g.length, &end) || end > c.tensor_bytes)
      return LLM_PARAM_INVALID;
    if (__builtin_add_overflow(per_tensor, g.length, &per_tensor)) return LLM_PARAM_INVALID;
  }
  if (__builtin_mul_overflow(per_tensor, uint64_t{q.tensors.size()}, &total) || total != q.total)
    return LLM_PARAM_INVALID;
  req->bases.reserve(q.tensors.size());
  for (uint32_t ti : q.tensors) {
    if (ti >= c.num_tensors) return LLM_PARAM_INVALID;
    req->bases.push_back(c.region ? c.region->base + ti * c.pitch : c.tensor(ti));
  }
  return LLM_SUCCESS;
}

// Walks the request's (tensor, range) pairs in wire order and hands them to `io` in batches of
// IOV_MAX, so the scatter list of even a huge request takes one batch of memory.
template <typename Io>
IoResult Stream(const Request &req, const iovec *head, size_t nhead, Io &&io) {
  std::vector<iovec> iov;
  iov.reserve(IOV_MAX + nhead);
  iov.insert(iov.end(), head, head + nhead);
  for (uint8_t *base : req.bases) {
    for (const ByteRange &g : req.wire.ranges) {
      AppendIov(&iov, base + g.offset, g.length);
      if (iov.size() >= IOV_MAX) {
        const IoResult r = io(iov.data(), iov.size());
        if (r != IoResult::kOk) return r;
        iov.clear();
      }
    }
  }
  return iov.empty() ? IoResult::kOk : io(iov.data(), iov.size());
}

// The request's (tensor, range) pairs in wire order, for kFlagCrc32c (transport/checked.h).
PairList Pairs(const Request &req) {
  const size_t ns = req.wire.ranges.size();
  PairList out;
  out.count = req.bases.size() * ns;
  out.at = [&req, ns](size_t i) {
    const ByteRange &g = req.wire.ranges[i % ns];
    return iovec{req.bases[i / ns] + g.offset, static_cast<size_t>(g.length)};
  };
  return out;
}

bool Reply(int fd, uint16_t type, Status st) {
  return SendFrame(fd, type, st, nullptr, 0, NowNs() + kFrameNs) == IoResult::kOk;
}

bool ServeRead(int fd, const Request &req, bool crc) {
  uint8_t head[kFrameHeaderBytes];
  const PairList pairs = crc ? Pairs(req) : PairList();
  EncodeHeader(FrameHeader{kReadResp, 0, LLM_SUCCESS, req.wire.total + (crc ? CrcTrailerBytes(pairs.count) : 0)},
               head);
  iovec h[2] = {{head, sizeof(head)}, {const_cast<uint8_t *>(kZeroPad), DataPad(sizeof(head))}};
  if (crc) return SendChecked(fd, h, 2, pairs, req.deadline) == IoResult::kOk;
  // Past the requester's deadline it has given up; stop sending and drop the connection.
  return Stream(req, h, 2, [&](iovec *v, size_t n) { return SendIov(fd, v, n, req.deadline); }) == IoResult::kOk;
}

// A checked write's data, then WRITE_DONE: success, or LLM_FAILED naming the first pair whose
// CRC32C differed (what arrived stays written: the pusher's call fails).
bool ServeWriteChecked(int fd, RecvBuffer &rb, const Request &req, const PeerLink *link) {
  const PairList pairs = Pairs(req);
  uint64_t bad = kNoMismatch;
  auto read = [&](iovec *v, size_t n) { return rb.ReadIov(v, n, req.deadline); };
  if (RecvChecked(read, nullptr, 0, pairs, &bad) != IoResult::kOk) return false;
  if (bad == kNoMismatch) return SendFrame(fd, kWriteDone, LLM_SUCCESS, nullptr, 0, req.deadline) == IoResult::kOk;
  NoteCrcMismatch(link, true);
  const ByteRange &g = req.wire.ranges[bad % req.wire.ranges.size()];
  const uint64_t stride = req.cache->stride ? req.cache->stride : 1;
  LogWarn("kvblocks.Integrity: CRC32C mismatch in a push from cluster %llu into cache %lld, tensor %u, block %llu "
          "(bytes %llu..%llu): corrupted in flight; the push fails",
          static_cast<unsigned long long>(link->remote_cluster_id), static_cast<long long>(req.wire.cache_id),
          req.wire.tensors[bad / req.wire.ranges.size()], static_cast<unsigned long long>(g.offset / stride),
          static_cast<unsigned long long>(g.offset), static_cast<unsigned long long>(g.offset + g.length));
  return SendMessage(fd, kWriteDone, LLM_FAILED, CrcMismatch{bad}, req.deadline) == IoResult::kOk;
}

// `pad`: the zeros before inline data (wire/messages.h DataPad), skipped here.
bool ServeWrite(int fd, RecvBuffer &rb, const Request &req, bool inline_data, size_t pad, bool crc, const PeerLink *link) {
  uint8_t sink[kDataAlign];
  if (inline_data && pad > 0 && rb.Read(sink, pad, req.deadline) != IoResult::kOk) return false;
  if (!inline_data && SendFrame(fd, kWriteReady, LLM_SUCCESS, nullptr, 0, req.deadline) != IoResult::kOk)
    return false;
  if (crc) return ServeWriteChecked(fd, rb, req, link);
  // RecvIov re-checks the deadline before every read, so once the pusher's call has returned
  // (its deadline passed) no further byte lands in the cache.
  if (Stream(req, nullptr, 0, [&](iovec *v, size_t n) { return rb.ReadIov(v, n, req.deadline); }) != IoResult::kOk)
    return false;
  return SendFrame(fd, kWriteDone, LLM_SUCCESS, nullptr, 0, req.deadline) == IoResult::kOk;
}

// Refuses a write; the announced inline bytes are drained so the channel stays usable. `q.total`
// is what the peer announced, even when the rest of its request did not decode. Checked inline data
// also has its CRC blocks, one per pair: only a request that decoded says how many (each pair has
// at least one byte, so an honest one has at most `total`); otherwise the channel closes.
bool RefuseWrite(int fd, RecvBuffer &rb, const XferRequest &q, bool inline_data, size_t pad, Status st, bool crc,
                 bool decoded) {
  if (!inline_data) return Reply(fd, kWriteReady, st);
  if (q.total > kMaxInlineWrite) return false;
  uint64_t pairs = 0;
  if (crc && (!decoded || __builtin_mul_overflow(uint64_t{q.tensors.size()}, uint64_t{q.ranges.size()}, &pairs) ||
              pairs > q.total))
    return false;
  std::string sink(pad + q.total + (crc ? CrcTrailerBytes(pairs) : 0), '\0');
  if (!sink.empty() && rb.Read(&sink[0], sink.size(), NowNs() + kFrameNs) != IoResult::kOk) return false;
  return Reply(fd, kWriteDone, st);
}

// Returns false when the connection must be closed.
bool ServeRequest(int fd, RecvBuffer &rb, const FrameHeader &h, const std::string &payload,
                  const LocalTable &caches, const PeerLink *link) {
  Request req;
  Status st;
  bool decoded = false;
  try {
    decoded = Decode(payload, &req.wire);
    st = decoded ? CheckRequest(&req, caches) : LLM_PARAM_INVALID;
  } catch (const std::bad_alloc &) {
    st = LLM_OUT_OF_MEMORY;
  }
  std::unique_ptr<MemoryUse> use;
  std::unique_ptr<ServingFd> serving;  // released before `use`
  if (st == LLM_SUCCESS) {
    use.reset(new MemoryUse(*req.cache));
    if (!use->ok) st = LLM_KV_CACHE_NOT_EXIST;  // unregistered while we checked
    else serving.reset(new ServingFd(req.cache.get(), fd));
  }
  const bool inline_data = (h.flags & kFlagInline) != 0;
  const bool crc = (h.flags & kFlagCrc32c) != 0;  // the requester's kvblocks.Integrity
  if (h.type == kReadReq) return st == LLM_SUCCESS ? ServeRead(fd, req, crc) : Reply(fd, kReadResp, st);
  const size_t pad = DataPad(kFrameHeaderBytes + payload.size());
  return st == LLM_SUCCESS ? ServeWrite(fd, rb, req, inline_data, pad, crc, link)
                           : RefuseWrite(fd, rb, req.wire, inline_data, pad, st, crc, decoded);
}

}  // namespace

void ServeChannel(int fd, PeerLink *link, const LocalTable &caches) {
  std::string payload;
  RecvBuffer rb(fd);  // pipelined requests arrive back to back: read them a buffer at a time
  for (;;) {
    FrameHeader h;
    // Idle between requests for as long as the peer likes (spinning a little first, as a
    // requester does for its reply: a requester's next request often follows within microseconds);
    // once a frame has begun, all of it must arrive within kFrameNs. A hang-up surfaces in the read.
    if (rb.empty() && WaitReadable(fd) != IoResult::kOk) break;
    const IoResult hr = rb.ReadHeader(&h, NowNs() + kFrameNs);
    if (hr != IoResult::kOk) {
      if (hr == IoResult::kError) SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + kErrorReplyNs);
      break;
    }
    // Longer than its type may be (kPayloadLimits): refused from the header, before any allocation.
    if (h.length > MaxPayload(h.type, Channel::kData)) {
      SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + kErrorReplyNs);
      break;
    }
    if (rb.ReadPayload(h, Channel::kData, &payload, NowNs() + kFrameNs) != IoResult::kOk) break;
    if (h.type == kReadReq || h.type == kWriteReq) {
      if (!ServeRequest(fd, rb, h, payload, caches, link)) break;
      if (payload.capacity() > kPayloadChunk) std::string().swap(payload);  // a rare large one: not kept
    } else if (!Reply(fd, kError, LLM_PARAM_INVALID)) {
      break;
    }
  }
  link->ForgetFd(fd);
}

}  // namespace kvblocks
