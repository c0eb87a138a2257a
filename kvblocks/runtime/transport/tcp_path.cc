// SPDX-License-Identifier: Apache-2.0
// The requester side of the TCP data path: one READ_REQ or WRITE_REQ per call on a pooled data
// channel, with the data streamed scatter-gather straight from or into the local tensors.
#include <algorithm>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "link/link.h"
#include "net/socket.h"
#include "transport/path.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

// A plan whose request would not fit one frame (kMaxControlPayload) goes as several requests on
// the same channel, each with every tensor and a run of the segments: [seg_begin, seg_end).
struct Piece {
  size_t seg_begin, seg_end;
  uint64_t bytes_per_tensor;
};

std::vector<Piece> SplitPlan(const Plan &plan) {
  const uint64_t fixed = kRequestFixedBytes + 4ULL * plan.src_tensors.size();
  const size_t per = static_cast<size_t>((kMaxControlPayload - fixed) / kRequestRangeBytes);
  std::vector<Piece> out;
  for (size_t b = 0; b < plan.segs.size(); b += per) {
    Piece p{b, std::min(plan.segs.size(), b + per), 0};
    for (size_t i = p.seg_begin; i < p.seg_end; ++i) p.bytes_per_tensor += plan.segs[i].len;
    out.push_back(p);
  }
  return out;
}

// The request as the server sees it: its own tensors and byte ranges.
XferRequest MakeRequest(const Plan &plan, const Piece &piece, int64_t cache_id, bool pull, int64_t deadline,
                        int64_t clock_offset) {
  XferRequest q;
  q.cache_id = cache_id;
  q.deadline = deadline + clock_offset;
  q.budget = std::max<int64_t>(deadline - NowNs(), 1);
  q.total = piece.bytes_per_tensor * plan.src_tensors.size();
  q.tensors = pull ? plan.src_tensors : plan.dst_tensors;
  q.ranges.reserve(piece.seg_end - piece.seg_begin);
  for (size_t i = piece.seg_begin; i < piece.seg_end; ++i) {
    const Segment &g = plan.segs[i];
    q.ranges.push_back(ByteRange{pull ? g.src_off : g.dst_off, g.len});
  }
  return q;
}

// Local side of the stream, in the order the peer gathers or scatters it.
void LocalIov(const Plan &plan, const Piece &piece, const CacheEntry &local, bool pull, std::vector<iovec> *iov) {
  const auto &tensors = pull ? plan.dst_tensors : plan.src_tensors;
  for (uint32_t t : tensors) {
    uint8_t *base = local.tensor(t);
    for (size_t i = piece.seg_begin; i < piece.seg_end; ++i) {
      const Segment &g = plan.segs[i];
      AppendIov(iov, base + (pull ? g.dst_off : g.src_off), g.len);
    }
  }
}

class TcpPath : public Path {
 public:
  TcpPath(Link *link, int64_t cache_id) : link_(link), cache_id_(cache_id) {}
  const char *name() const override { return "tcp"; }
  Status Execute(const Plan &plan, const CacheEntry &local, bool pull, int64_t deadline) override;

 private:
  Status Exchange(int fd, std::vector<iovec> &iov, size_t head, bool pull, bool inline_data, uint64_t total,
                  int64_t deadline, bool *reusable);
  Link *link_;  // owns this path
  int64_t cache_id_;
};

// Expects a reply frame of `type`; a non-zero status ends the exchange with it.
Status Expect(int fd, uint16_t type, int64_t deadline, FrameHeader *h, bool *reusable) {
  const IoResult r = RecvHeader(fd, h, deadline);
  if (r != IoResult::kOk) return Fail(StatusOf(r), "the peer did not answer in time or closed the channel");
  if (h->type != type) return Fail(LLM_LINK_FAILED, "unexpected frame type %u from the peer", h->type);
  if (h->status != LLM_SUCCESS) {
    *reusable = h->length == 0;
    return Fail(h->status, "the peer refused the request");
  }
  return LLM_SUCCESS;
}

Status TcpPath::Exchange(int fd, std::vector<iovec> &iov, size_t head, bool pull, bool inline_data, uint64_t total,
                         int64_t deadline, bool *reusable) {
  FrameHeader h;
  iovec *data = iov.data() + head;
  const size_t ndata = iov.size() - head;
  Status st = StatusOf(SendIov(fd, iov.data(), inline_data ? iov.size() : head, deadline));
  if (st != LLM_SUCCESS) return st;
  if (pull) {
    if ((st = Expect(fd, kReadResp, deadline, &h, reusable)) != LLM_SUCCESS) return st;
    if (h.length != total) return Fail(LLM_LINK_FAILED, "the peer announced %llu bytes, not %llu",
                                       static_cast<unsigned long long>(h.length),
                                       static_cast<unsigned long long>(total));
    st = StatusOf(RecvIov(fd, data, ndata, deadline));
    *reusable = st == LLM_SUCCESS;
    return st;
  }
  if (!inline_data) {
    if ((st = Expect(fd, kWriteReady, deadline, &h, reusable)) != LLM_SUCCESS) return st;
    if ((st = StatusOf(SendIov(fd, data, ndata, deadline))) != LLM_SUCCESS) return st;
  }
  if ((st = Expect(fd, kWriteDone, deadline, &h, reusable)) != LLM_SUCCESS) return st;
  *reusable = h.length == 0;
  return LLM_SUCCESS;
}

Status TcpPath::Execute(const Plan &plan, const CacheEntry &local, bool pull, int64_t deadline) {
  Status st;
  const int fd = link_->AcquireChannel(deadline, &st);
  if (fd < 0) return st;
  bool reusable = true;
  st = LLM_SUCCESS;
  for (const Piece &piece : SplitPlan(plan)) {
    std::string body;
    Encode(MakeRequest(plan, piece, cache_id_, pull, deadline, link_->clock_offset_ns), &body);
    const uint64_t total = piece.bytes_per_tensor * plan.src_tensors.size();
    const bool inline_data = !pull && total <= kMaxInlineWrite;
    uint8_t head[kFrameHeaderBytes];
    EncodeHeader(FrameHeader{static_cast<uint16_t>(pull ? kReadReq : kWriteReq),
                             static_cast<uint16_t>(inline_data ? kFlagInline : 0), 0, body.size()},
                 head);
    std::vector<iovec> iov;
    iov.reserve(plan.src_tensors.size() * (piece.seg_end - piece.seg_begin) + 2);
    iov.push_back(iovec{head, sizeof(head)});
    iov.push_back(iovec{&body[0], body.size()});
    LocalIov(plan, piece, local, pull, &iov);
    reusable = false;
    st = Exchange(fd, iov, 2, pull, inline_data, total, deadline, &reusable);
    if (st != LLM_SUCCESS) break;
  }
  link_->ReleaseChannel(fd, reusable);
  // The server stops at its view of our deadline, which the clock offset measured at link time
  // may put a little early: a channel it closed just before the deadline means it gave up in time.
  if (st == LLM_LINK_FAILED && NowNs() >= deadline - kDeadlineSlackNs && link_->alive.load()) st = LLM_TIMEOUT;
  return st;
}

}  // namespace

std::unique_ptr<Path> MakeTcpPath(Link *link, int64_t remote_cache_id) {
  return std::unique_ptr<Path>(new TcpPath(link, remote_cache_id));
}

}  // namespace kvblocks
