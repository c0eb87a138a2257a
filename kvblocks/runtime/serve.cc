// SPDX-License-Identifier: Apache-2.0
// The serving side of a data channel. Runs on runtime threads only (never Python), and checks
// every request against this process's own cache table: a peer's offsets are never trusted.
#include <algorithm>
#include <climits>
#include <unistd.h>

#include "runtime.h"

namespace kvblocks {
namespace {

constexpr int64_t kFrameNs = 10LL * 1000000000LL;      // a started frame must arrive within this
constexpr int64_t kMaxServeNs = 600LL * 1000000000LL;  // no request holds a serving thread longer
constexpr size_t kIovBatch = IOV_MAX;                  // scatter entries built per system call

struct Request {
  std::shared_ptr<CacheEntry> cache;
  int64_t deadline = 0;
  std::vector<uint8_t *> bases;     // one per requested tensor, in wire order
  const uint8_t *segs = nullptr;    // {u64 offset, u64 length} x nsegs, inside the frame payload
  uint32_t nsegs = 0;
  uint64_t total = 0;
  uint64_t declared = 0;
};

// Parses READ/WRITE requests: i64 cache_id, i64 deadline (our clock), i64 budget, u32 tensors, u32 segments,
// u64 data length, u32 tensor[...], {u64 offset, u64 length}[...], and checks every range against
// our own table before anything is touched.
Status ParseRequest(Reader &r, Request *req, const std::function<std::shared_ptr<CacheEntry>(int64_t)> &find) {
  const int64_t cache_id = r.Get<int64_t>();
  req->deadline = r.Get<int64_t>();
  const int64_t budget = r.Get<int64_t>();
  const uint32_t nt = r.Get<uint32_t>();
  const uint32_t ns = r.Get<uint32_t>();
  req->declared = r.Get<uint64_t>();
  if (!r.ok || r.n - r.off != static_cast<uint64_t>(nt) * 4 + static_cast<uint64_t>(ns) * 16) return LLM_PARAM_INVALID;
  // The requester's deadline bounds how long we serve it, but never beyond our own limit.
  // Two views of the requester's deadline, and the earlier wins: the absolute one (its clock plus
  // the offset measured at link time) still holds if we were frozen before reading this request;
  // the remaining budget, counted from now, does not drift however long the link has lived.
  if (req->deadline <= 0 || budget <= 0) return LLM_PARAM_INVALID;
  const int64_t now = NowNs();
  req->deadline = std::min({req->deadline, now + budget, now + kMaxServeNs});
  req->cache = find(cache_id);
  if (!req->cache) return LLM_KV_CACHE_NOT_EXIST;
  const CacheEntry &c = *req->cache;
  if (nt == 0 || nt > c.num_tensors || ns == 0) return LLM_PARAM_INVALID;
  const uint8_t *tensors = r.Bytes(static_cast<size_t>(nt) * 4);
  req->segs = r.Bytes(static_cast<size_t>(ns) * 16);
  req->nsegs = ns;
  uint64_t per_tensor = 0;
  for (uint32_t s = 0; s < ns; ++s) {
    uint64_t off, len, end;
    memcpy(&off, req->segs + s * 16, 8);
    memcpy(&len, req->segs + s * 16 + 8, 8);
    if (len == 0 || __builtin_add_overflow(off, len, &end) || end > c.tensor_bytes) return LLM_PARAM_INVALID;
    if (__builtin_add_overflow(per_tensor, len, &per_tensor)) return LLM_PARAM_INVALID;
  }
  if (__builtin_mul_overflow(per_tensor, static_cast<uint64_t>(nt), &req->total) || req->total != req->declared)
    return LLM_PARAM_INVALID;
  req->bases.reserve(nt);
  for (uint32_t t = 0; t < nt; ++t) {
    uint32_t ti;
    memcpy(&ti, tensors + t * 4, 4);
    if (ti >= c.num_tensors) return LLM_PARAM_INVALID;
    req->bases.push_back(c.region ? c.region->base + ti * c.pitch : reinterpret_cast<uint8_t *>(c.addrs[ti]));
  }
  return LLM_SUCCESS;
}

// Walks the request's (tensor, segment) ranges in wire order and hands them to `io` in batches, so
// the scatter list of even a huge request takes one batch of memory.
template <typename Io>
IoResult Stream(const Request &req, const iovec *head, Io &&io) {
  std::vector<iovec> iov;
  iov.reserve(kIovBatch + 1);
  if (head != nullptr) iov.push_back(*head);
  for (uint8_t *base : req.bases) {
    for (uint32_t s = 0; s < req.nsegs; ++s) {
      uint64_t off, len;
      memcpy(&off, req.segs + s * 16, 8);
      memcpy(&len, req.segs + s * 16 + 8, 8);
      AppendIov(&iov, base + off, len);
      if (iov.size() >= kIovBatch) {
        const IoResult r = io(iov.data(), iov.size());
        if (r != IoResult::kOk) return r;
        iov.clear();
      }
    }
  }
  return iov.empty() ? IoResult::kOk : io(iov.data(), iov.size());
}

// Returns false when the connection must be closed.
bool ServeRequest(int fd, const FrameHeader &h, Reader &r,
                  const std::function<std::shared_ptr<CacheEntry>(int64_t)> &find) {
  Request req;
  Status st;
  try {
    st = ParseRequest(r, &req, find);
  } catch (const std::bad_alloc &) {
    st = LLM_OUT_OF_MEMORY;
  }
  std::unique_ptr<CacheUse> use;
  if (st == LLM_SUCCESS) {
    use.reset(new CacheUse(*req.cache));
    if (!use->ok) st = LLM_KV_CACHE_NOT_EXIST;  // unregistered while we parsed
  }
  if (h.type == kReadReq) {
    if (st != LLM_SUCCESS) return SendFrame(fd, kReadResp, st, nullptr, 0, NowNs() + kFrameNs) == IoResult::kOk;
    FrameHeader resp{kMagic, kReadResp, 0, LLM_SUCCESS, 0, req.total};
    const iovec head{&resp, sizeof(resp)};
    // Past the requester's deadline it has given up; stop sending and drop the connection.
    return Stream(req, &head, [&](iovec *v, size_t n) { return SendIov(fd, v, n, req.deadline); }) ==
           IoResult::kOk;
  }
  // Write: the data either follows inline (small writes) or after our READY.
  const bool inline_data = (h.flags & 1) != 0;
  if (st != LLM_SUCCESS) {
    if (inline_data) {
      // Drain the announced bytes so the channel stays usable; refuse absurd announcements.
      if (req.declared > kMaxInlineWrite) return false;
      std::string sink(req.declared, '\0');
      if (req.declared > 0 && RecvAll(fd, &sink[0], sink.size(), NowNs() + kFrameNs) != IoResult::kOk) return false;
      return SendFrame(fd, kWriteDone, st, nullptr, 0, NowNs() + kFrameNs) == IoResult::kOk;
    }
    return SendFrame(fd, kWriteReady, st, nullptr, 0, NowNs() + kFrameNs) == IoResult::kOk;
  }
  if (!inline_data && SendFrame(fd, kWriteReady, LLM_SUCCESS, nullptr, 0, req.deadline) != IoResult::kOk)
    return false;
  // RecvIov re-checks the deadline before every read, so once the pusher's call has returned
  // (its deadline passed) no further byte lands in the cache.
  if (Stream(req, nullptr, [&](iovec *v, size_t n) { return RecvIov(fd, v, n, req.deadline); }) != IoResult::kOk)
    return false;
  return SendFrame(fd, kWriteDone, LLM_SUCCESS, nullptr, 0, req.deadline) == IoResult::kOk;
}

}  // namespace

void Impl::ServeConnection(int fd, std::shared_ptr<struct Link> link) {
  auto find = [this](int64_t id) { return FindCache(id); };
  std::string payload;
  for (;;) {
    FrameHeader h;
    const IoResult hr = RecvHeader(fd, &h, 0);
    if (hr != IoResult::kOk) {
      if (hr == IoResult::kError) SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + 100000000);
      break;
    }
    if (h.length > kMaxControlPayload) {
      SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + 100000000);
      break;
    }
    payload.resize(h.length);
    if (h.length > 0 && RecvAll(fd, &payload[0], h.length, NowNs() + kFrameNs) != IoResult::kOk) break;
    Reader r{reinterpret_cast<const uint8_t *>(payload.data()), payload.size()};
    if (h.type == kReadReq || h.type == kWriteReq) {
      if (!ServeRequest(fd, h, r, find)) break;
    } else if (SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + kFrameNs) != IoResult::kOk) {
      break;
    }
  }
  link->ForgetFd(fd);
}

}  // namespace kvblocks
