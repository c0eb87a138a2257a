// SPDX-License-Identifier: Apache-2.0
// The requester side of the TCP data path: one READ_REQ or WRITE_REQ per call on a pooled data
// channel, with the data streamed scatter-gather straight from or into the local tensors. Small
// asynchronous transfers to one peer are pipelined on one channel: the server serves a channel's
// requests in order, so request k+1 is written before reply k is read, and replies are matched to
// requests by position.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <deque>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "net/socket.h"
#include "transport/checked.h"
#include "transport/copy_pool.h"
#include "transport/path.h"
#include "transport/peer.h"
#include "transport/tcp/tcp_path.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

// A plan whose request would not fit one frame (kMaxRequestPayload) goes as several requests on
// the same channel, each with every tensor and a run of the segments: [seg_begin, seg_end).
// `order`, when set, lists the segments in the order they go on the wire (Plan::Order).
struct Piece {
  size_t seg_begin, seg_end;
  uint64_t bytes_per_tensor;
  const std::vector<uint32_t> *order;
};

// The i-th segment of the plan in the piece's wire order.
inline const Segment &Seg(const Plan &plan, const Piece &p, size_t i) {
  return plan.segs[p.order ? (*p.order)[i] : i];
}

// Plans of many small ranges (a layout transform) go in the server's order: ranges adjacent in its
// memory become one iovec there and it reads or writes them front to back. The kernel's copy per
// iovec is not cheap (a 256-byte head chunk per iovec made the server's sendmsg copy most of a
// transform's time), and this side's ranges are the ones it can afford to scatter.
const std::vector<uint32_t> *WireOrder(const Plan &plan, bool pull) {
  return plan.SmallRanges() ? &plan.Order(pull) : nullptr;
}

std::vector<Piece> SplitPlan(const Plan &plan, const std::vector<uint32_t> *order) {
  const uint64_t fixed = kRequestFixedBytes + 4ULL * plan.src_tensors.size();
  const size_t per = static_cast<size_t>((kMaxRequestPayload - fixed) / kRequestRangeBytes);
  std::vector<Piece> out;
  for (size_t b = 0; b < plan.segs.size(); b += per) {
    Piece p{b, std::min(plan.segs.size(), b + per), 0, order};
    for (size_t i = p.seg_begin; i < p.seg_end; ++i) p.bytes_per_tensor += Seg(plan, p, i).len;
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
    const Segment &g = Seg(plan, piece, i);
    q.ranges.push_back(ByteRange{pull ? g.src_off : g.dst_off, g.len});
  }
  return q;
}

// Local side of the stream, in the order the peer gathers or scatters it.
void LocalIov(const Plan &plan, const Piece &piece, const LocalMemory &local, bool pull, std::vector<iovec> *iov) {
  const auto &tensors = pull ? plan.dst_tensors : plan.src_tensors;
  for (uint32_t t : tensors) {
    uint8_t *base = local.tensor(t);
    for (size_t i = piece.seg_begin; i < piece.seg_end; ++i) {
      const Segment &g = Seg(plan, piece, i);
      AppendIov(iov, base + (pull ? g.dst_off : g.src_off), g.len);
    }
  }
}

// The same stream as pairs (transport/checked.h), for kvblocks.Integrity=crc32c.
PairList LocalPairs(const Plan &plan, const Piece &piece, const LocalMemory &local, bool pull) {
  const auto &tensors = pull ? plan.dst_tensors : plan.src_tensors;
  const size_t ns = piece.seg_end - piece.seg_begin;
  PairList out;
  out.count = tensors.size() * ns;
  out.at = [&plan, &piece, &local, &tensors, ns, pull](size_t i) {
    const Segment &g = Seg(plan, piece, piece.seg_begin + i % ns);
    return iovec{local.tensor(tensors[i / ns]) + (pull ? g.dst_off : g.src_off), static_cast<size_t>(g.len)};
  };
  return out;
}

// The zeros between a frame and its data (wire/messages.h DataPad): read into `sink` on a pull,
// sent on an inline push; none before a large push's data, which follows WRITE_READY.
iovec DataPadIov(bool pull, bool inline_data, size_t body, uint8_t *sink) {
  if (pull) return iovec{sink, DataPad(kFrameHeaderBytes)};
  if (!inline_data) return iovec{sink, 0};
  return iovec{const_cast<uint8_t *>(kZeroPad), DataPad(kFrameHeaderBytes + body)};
}

// One request of a pipelined run: its frame, then (inline pushes) its data, and where the reply goes.
struct Pending {
  PipeItem item;
  uint8_t head[kFrameHeaderBytes];
  std::string body;
  std::vector<iovec> data;  // the local side of the stream, after its DataPadIov
  uint8_t sink[kDataAlign];  // a pull's reply pad lands here
  uint64_t total = 0;
  uint64_t sent_end = 0;  // the run's sent-byte count once this request is fully written
};

// A large transfer over TLS goes as stripes: its tensor pairs split between channels that run at
// once. One TLS stream encrypts on one core and decrypts on one (OpenSSL 3.0's AES-128-GCM: 3.8 GB/s
// a core on AMD Zen 3, 1.2 GB/s a stream end to end), where a clear stream is the kernel's copy.
size_t Stripes(const PeerLink &link, const Plan &plan) {
  if (!link.encrypted || plan.total_bytes() < kStripeMinBytes || plan.src_tensors.size() < 2) return 1;
  return std::min(CopyThreads() + 1, plan.src_tensors.size());
}

// `plan`'s tensor pairs in `n` runs of nearly equal count, each with all of its segments.
std::vector<Plan> SplitTensors(const Plan &plan, size_t n) {
  std::vector<Plan> out(n);
  const size_t pairs = plan.src_tensors.size();
  for (size_t k = 0; k < n; ++k) {
    Plan &p = out[k];
    const size_t b = pairs * k / n, e = pairs * (k + 1) / n;
    p.src_tensors.assign(plan.src_tensors.begin() + b, plan.src_tensors.begin() + e);
    p.dst_tensors.assign(plan.dst_tensors.begin() + b, plan.dst_tensors.begin() + e);
    p.segs = plan.segs;
    p.bytes_per_tensor = plan.bytes_per_tensor;
  }
  return out;
}

class TcpPath : public Path {
 public:
  TcpPath(PeerLink *link, std::shared_ptr<RequestChannels> channels, int64_t cache_id)
      : link_(link), channels_(std::move(channels)), cache_id_(cache_id) {}
  const char *name() const override { return "tcp"; }
  PathMode mode() const override { return PathMode::kServed; }
  Status Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) override;
  const void *PipelineKey(const Plan &plan, bool pull) const override;
  void ExecutePipelined(PipeFeed *feed) override;

 private:
  void Build(const PipeItem &it, Pending *p) const;
  // The server stops at its view of our deadline, which errs early by up to the offset's error:
  // a channel it closed that close to the deadline means it gave up in time.
  int64_t Slack() const { return std::max(kDeadlineSlackNs, link_->clock_slack_ns); }
  Status ReadReply(RecvBuffer &rb, Pending &p, bool *reusable);
  Status Exchange(int fd, std::vector<iovec> &iov, size_t head, bool pull, bool inline_data, uint64_t total,
                  int64_t deadline, bool *reusable);
  // One request of a kvblocks.Integrity=crc32c transfer (kFlagCrc32c; transport/checked.h).
  Status ExchangeChecked(int fd, const Plan &plan, const Piece &piece, const LocalMemory &local, bool pull,
                         int64_t deadline, bool *reusable);
  Status WriteDoneChecked(int fd, const Plan &plan, const Piece &piece, const LocalMemory &local, uint64_t pairs,
                          int64_t deadline, bool *reusable);
  Status Mismatch(const Plan &plan, const Piece &piece, const LocalMemory &local, bool pull, uint64_t pair) const;
  Status ExecuteOn(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline);
  Status ExecuteStriped(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline, size_t stripes);
  PeerLink *link_;  // owns this path
  std::shared_ptr<RequestChannels> channels_;  // the link's pool (the served backend's state on it)
  int64_t cache_id_;
};

// Expects a reply frame of `type`; a non-zero status ends the exchange with it.
Status Expect(int fd, uint16_t type, int64_t deadline, FrameHeader *h, bool *reusable) {
  const IoResult r = RecvReplyHeader(fd, h, deadline);
  if (r != IoResult::kOk) return Fail(StatusOf(r), "the peer did not answer in time or closed the channel");
  if (h->type != type) return Fail(LLM_LINK_FAILED, "unexpected frame type %u from the peer", h->type);
  if (h->status != LLM_SUCCESS) {
    *reusable = h->length == 0;
    return Fail(h->status, "the peer refused the request");
  }
  return LLM_SUCCESS;
}

// Expect, reading through the run's buffer.
Status Expect(RecvBuffer &rb, uint16_t type, int64_t deadline, FrameHeader *h, bool *reusable) {
  const IoResult r = rb.ReadHeader(h, deadline);
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

// Names the pair whose CRC differed by this side's tensor and block (pull: where it landed; push:
// where it came from), the peer's cache and cluster.
Status TcpPath::Mismatch(const Plan &plan, const Piece &piece, const LocalMemory &local, bool pull,
                         uint64_t pair) const {
  const size_t ns = piece.seg_end - piece.seg_begin;
  const uint32_t t = (pull ? plan.dst_tensors : plan.src_tensors)[pair / ns];
  const Segment &g = Seg(plan, piece, piece.seg_begin + pair % ns);
  const uint64_t off = pull ? g.dst_off : g.src_off, stride = local.stride ? local.stride : 1;
  const uint64_t first = off / stride, last = (off + g.len - 1) / stride;
  char blocks[64];
  snprintf(blocks, sizeof(blocks), first == last ? "block %llu" : "blocks %llu-%llu",
           static_cast<unsigned long long>(first), static_cast<unsigned long long>(last));
  return Fail(LLM_FAILED,
              "kvblocks.Integrity=crc32c: CRC32C mismatch in tensor %u, %s (bytes %llu..%llu) %s cache %lld of "
              "cluster %llu: the bytes were corrupted in flight (%s)",
              t, blocks, static_cast<unsigned long long>(off), static_cast<unsigned long long>(off + g.len),
              pull ? "pulled from" : "pushed to", static_cast<long long>(cache_id_),
              static_cast<unsigned long long>(link_->remote_cluster_id),
              pull ? "checked here; the destination blocks of this call hold what arrived"
                   : "checked by the peer, which holds what arrived");
}

// WRITE_DONE of a checked write: success, a CRC mismatch (its pair), or a refusal.
Status TcpPath::WriteDoneChecked(int fd, const Plan &plan, const Piece &piece, const LocalMemory &local,
                                 uint64_t pairs, int64_t deadline, bool *reusable) {
  FrameHeader h;
  const IoResult r = RecvReplyHeader(fd, &h, deadline);
  if (r != IoResult::kOk) return Fail(StatusOf(r), "the peer did not answer in time or closed the channel");
  if (h.type != kWriteDone) return Fail(LLM_LINK_FAILED, "unexpected frame type %u from the peer", h.type);
  if (h.status != LLM_FAILED || h.length != kCrcMismatchBytes) {
    *reusable = h.length == 0;
    if (h.status != LLM_SUCCESS) return Fail(h.status, "the peer refused the request");
    return *reusable ? LLM_SUCCESS : Fail(LLM_LINK_FAILED, "the peer answered a write with %llu bytes",
                                          static_cast<unsigned long long>(h.length));
  }
  std::string payload(kCrcMismatchBytes, '\0');
  CrcMismatch m;
  if (RecvAll(fd, &payload[0], payload.size(), deadline) != IoResult::kOk || !Decode(payload, &m) || m.pair >= pairs)
    return Fail(LLM_FAILED, "kvblocks.Integrity=crc32c: cluster %llu found a CRC32C mismatch in a push but named no "
                "pair of it", static_cast<unsigned long long>(link_->remote_cluster_id));
  *reusable = true;
  return Mismatch(plan, piece, local, false, m.pair);
}

Status TcpPath::ExchangeChecked(int fd, const Plan &plan, const Piece &piece, const LocalMemory &local, bool pull,
                                int64_t deadline, bool *reusable) {
  std::string body;
  Encode(MakeRequest(plan, piece, cache_id_, pull, deadline, link_->clock_offset_ns), &body);
  const uint64_t total = piece.bytes_per_tensor * plan.src_tensors.size();
  const bool inline_data = !pull && total <= kMaxInlineWrite;
  const PairList pairs = LocalPairs(plan, piece, local, pull);
  uint8_t head[kFrameHeaderBytes], sink[kDataAlign];
  EncodeHeader(FrameHeader{static_cast<uint16_t>(pull ? kReadReq : kWriteReq),
                           static_cast<uint16_t>((inline_data ? kFlagInline : 0) | kFlagCrc32c), 0, body.size()},
               head);
  iovec req[3] = {{head, sizeof(head)}, {&body[0], body.size()}, DataPadIov(pull, inline_data, body.size(), sink)};
  FrameHeader h;
  Status st;
  if (inline_data) {
    if ((st = StatusOf(SendChecked(fd, req, 3, pairs, deadline))) != LLM_SUCCESS) return st;
    return WriteDoneChecked(fd, plan, piece, local, pairs.count, deadline, reusable);
  }
  if ((st = StatusOf(SendIov(fd, req, 2, deadline))) != LLM_SUCCESS) return st;
  if (!pull) {
    if ((st = Expect(fd, kWriteReady, deadline, &h, reusable)) != LLM_SUCCESS) return st;
    if ((st = StatusOf(SendChecked(fd, nullptr, 0, pairs, deadline))) != LLM_SUCCESS) return st;
    return WriteDoneChecked(fd, plan, piece, local, pairs.count, deadline, reusable);
  }
  if ((st = Expect(fd, kReadResp, deadline, &h, reusable)) != LLM_SUCCESS) return st;
  const uint64_t want = total + CrcTrailerBytes(pairs.count);
  if (h.length != want)
    return Fail(LLM_LINK_FAILED, "the peer announced %llu bytes, not %llu", static_cast<unsigned long long>(h.length),
                static_cast<unsigned long long>(want));
  uint64_t bad = kNoMismatch;
  st = StatusOf(RecvChecked([&](iovec *v, size_t n) { return RecvIov(fd, v, n, deadline); }, &req[2], 1, pairs, &bad));
  *reusable = st == LLM_SUCCESS;
  if (st != LLM_SUCCESS || bad == kNoMismatch) return st;
  NoteCrcMismatch(link_, false);
  return Mismatch(plan, piece, local, true, bad);
}

Status TcpPath::Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) {
  // The caller's engine decides (kvblocks.Integrity); a peer that cannot check is refused, never skipped.
  if (link_->integrity && (link_->capabilities & kCapCrc32c) == 0)
    return Fail(LLM_FEATURE_NOT_ENABLED,
                "kvblocks.Integrity=crc32c: cluster %llu does not offer CRC32C-checked transfers (an older "
                "kvblocks); refusing to move the bytes unchecked",
                static_cast<unsigned long long>(link_->remote_cluster_id));
  const size_t stripes = Stripes(*link_, plan);
  return stripes > 1 ? ExecuteStriped(plan, local, pull, deadline, stripes) : ExecuteOn(plan, local, pull, deadline);
}

// Each stripe on its own channel, and on a thread of the copy pool (the caller's takes one too): a
// stripe's failure is recorded with its thread's reason, which the caller's thread then reports.
Status TcpPath::ExecuteStriped(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline,
                               size_t stripes) {
  std::vector<Plan> parts = SplitTensors(plan, stripes);
  std::vector<std::string> why(parts.size());
  const Status st = RunChunks(parts.size(), plan.total_bytes(), [&](size_t c) {
    const Status s = ExecuteOn(parts[c], local, pull, deadline);
    if (s != LLM_SUCCESS) why[c] = LastErrorMessage();
    return s;
  });
  if (st == LLM_SUCCESS) return st;
  for (const std::string &w : why)
    if (!w.empty()) return Fail(st, "%s", w.c_str());
  return st;
}

// One channel: the plan's pieces one after the other.
Status TcpPath::ExecuteOn(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) {
  Status st;
  const int fd = channels_->Acquire(deadline, &st);
  if (fd < 0) return st;
  bool reusable = true;
  st = LLM_SUCCESS;
  for (const Piece &piece : SplitPlan(plan, WireOrder(plan, pull))) {
    if (link_->integrity) {
      reusable = false;
      if ((st = ExchangeChecked(fd, plan, piece, local, pull, deadline, &reusable)) != LLM_SUCCESS) break;
      continue;
    }
    std::string body;
    Encode(MakeRequest(plan, piece, cache_id_, pull, deadline, link_->clock_offset_ns), &body);
    const uint64_t total = piece.bytes_per_tensor * plan.src_tensors.size();
    const bool inline_data = !pull && total <= kMaxInlineWrite;
    uint8_t head[kFrameHeaderBytes], sink[kDataAlign];
    EncodeHeader(FrameHeader{static_cast<uint16_t>(pull ? kReadReq : kWriteReq),
                             static_cast<uint16_t>(inline_data ? kFlagInline : 0), 0, body.size()},
                 head);
    std::vector<iovec> iov;
    iov.reserve(plan.src_tensors.size() * (piece.seg_end - piece.seg_begin) + 3);
    iov.push_back(iovec{head, sizeof(head)});
    iov.push_back(iovec{&body[0], body.size()});
    iov.push_back(DataPadIov(pull, inline_data, body.size(), sink));  // the stream's data starts here
    LocalIov(plan, piece, local, pull, &iov);
    reusable = false;
    st = Exchange(fd, iov, 2, pull, inline_data, total, deadline, &reusable);
    if (st != LLM_SUCCESS) break;
  }
  channels_->Release(fd, reusable);
  if (st == LLM_LINK_FAILED && NowNs() >= deadline - Slack() && link_->alive.load()) st = LLM_TIMEOUT;
  return st;
}

// ------------------------------------------------------------------ pipelined runs
// Small transfers only: one frame each, replies and inline data at most kMaxInlineWrite, so a run
// stays latency-bound and large transfers keep channels of their own.
const void *TcpPath::PipelineKey(const Plan &plan, bool) const {
  if (link_->integrity) return nullptr;  // checked transfers run one request at a time (Execute)
  const uint64_t fixed = kRequestFixedBytes + 4ULL * plan.src_tensors.size();
  if (plan.segs.size() > (kMaxRequestPayload - fixed) / kRequestRangeBytes) return nullptr;
  uint64_t per_tensor = 0;
  for (const Segment &g : plan.segs) per_tensor += g.len;
  return per_tensor * plan.src_tensors.size() <= kMaxInlineWrite ? link_ : nullptr;
}

void TcpPath::Build(const PipeItem &it, Pending *p) const {
  const Plan &plan = *it.plan;
  const Piece piece = SplitPlan(plan, nullptr).front();
  p->item = it;
  Encode(MakeRequest(plan, piece, cache_id_, it.pull, it.deadline, link_->clock_offset_ns), &p->body);
  p->total = piece.bytes_per_tensor * plan.src_tensors.size();
  EncodeHeader(FrameHeader{static_cast<uint16_t>(it.pull ? kReadReq : kWriteReq),
                           static_cast<uint16_t>(it.pull ? 0 : kFlagInline), 0, p->body.size()},
               p->head);
  p->data.reserve(plan.src_tensors.size() * plan.segs.size() + 1);
  p->data.push_back(DataPadIov(it.pull, !it.pull, p->body.size(), p->sink));
  LocalIov(plan, piece, *it.local, it.pull, &p->data);
}

// Reads the reply to `p`, the oldest request in flight, by p's deadline.
Status TcpPath::ReadReply(RecvBuffer &rb, Pending &p, bool *reusable) {
  FrameHeader h;
  *reusable = false;
  Status st = Expect(rb, p.item.pull ? kReadResp : kWriteDone, p.item.deadline, &h, reusable);
  if (st != LLM_SUCCESS) return st;
  if (!p.item.pull) {
    *reusable = h.length == 0;
    return *reusable ? LLM_SUCCESS : Fail(LLM_LINK_FAILED, "the peer answered a write with %llu bytes",
                                          static_cast<unsigned long long>(h.length));
  }
  if (h.length != p.total)
    return Fail(LLM_LINK_FAILED, "the peer announced %llu bytes, not %llu", static_cast<unsigned long long>(h.length),
                static_cast<unsigned long long>(p.total));
  st = StatusOf(rb.ReadIov(p.data.data(), p.data.size(), p.item.deadline));
  *reusable = st == LLM_SUCCESS;
  return st;
}

namespace {

// The run's outgoing bytes: every queued request frame (and inline data) not yet written.
struct SendQueue {
  std::vector<iovec> iov;
  size_t first = 0;
  uint64_t queued = 0, sent = 0;

  void Add(void *p, size_t n) {
    if (n == 0) return;
    iov.push_back(iovec{p, n});
    queued += n;
  }
  // Writes what the socket takes now, without waiting: a run never blocks on a write while a reply
  // it has not read could be holding the server up.
  IoResult Flush(int fd) {
    while (first < iov.size()) {
      const ssize_t n = SendSome(fd, iov.data() + first, iov.size() - first);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? IoResult::kOk : IoResult::kClosed;
      }
      sent += static_cast<uint64_t>(n);
      for (size_t left = static_cast<size_t>(n); left > 0;) {
        iovec &v = iov[first];
        const size_t k = std::min(left, v.iov_len);
        v.iov_base = static_cast<uint8_t *>(v.iov_base) + k;
        v.iov_len -= k;
        left -= k;
        if (v.iov_len == 0) ++first;
      }
    }
    iov.clear();
    first = 0;
    return IoResult::kOk;
  }
};

// Waits until the socket takes more bytes; the reply to every earlier request has been read.
IoResult WaitWritable(int fd, int64_t deadline) {
  for (;;) {
    const int64_t left = deadline - NowNs();
    if (left <= 0) return IoResult::kTimeout;
    pollfd p{fd, POLLOUT, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, INT_MAX)));
    if (rc > 0) return (p.revents & (POLLERR | POLLNVAL)) ? IoResult::kClosed : IoResult::kOk;
    if (rc < 0 && errno != EINTR) return IoResult::kError;
  }
}

constexpr size_t kMaxPipelined = 64;  // requests in flight on one channel

}  // namespace

void TcpPath::ExecutePipelined(PipeFeed *feed) {
  PipeItem it;
  if (!feed->Next(&it)) return;
  Status st;
  const int fd = channels_->Acquire(it.deadline, &st);
  if (fd < 0) {
    feed->Done(it, st);
    return;  // the rest stay queued and start on their own
  }
  const NoSpin no_spin;  // a run has its next reply coming: a spin would only slow the peer
  std::deque<Pending> q;  // written or being written, reply not read; stable addresses
  RecvBuffer rb(fd);      // one recv for several small replies, copied out reply by reply
  SendQueue out;
  bool got = true, reusable = true, broken = false;  // got: `it` is taken but not yet queued
  for (;;) {
    for (; q.size() < kMaxPipelined && (got || (got = feed->Next(&it))); got = false) {
      q.emplace_back();
      Pending &p = q.back();
      Build(it, &p);
      out.Add(p.head, sizeof(p.head));
      out.Add(&p.body[0], p.body.size());
      if (!it.pull)
        for (const iovec &v : p.data) out.Add(v.iov_base, v.iov_len);
      p.sent_end = out.queued;
    }
    if (q.empty()) break;
    Pending &p = q.front();
    IoResult w = out.Flush(fd);
    while (w == IoResult::kOk && out.sent < p.sent_end && (w = WaitWritable(fd, p.item.deadline)) == IoResult::kOk)
      w = out.Flush(fd);
    st = w == IoResult::kOk ? ReadReply(rb, p, &reusable) : Fail(StatusOf(w), "the peer stopped reading requests");
    if (st == LLM_LINK_FAILED && NowNs() >= p.item.deadline - Slack() && link_->alive.load()) st = LLM_TIMEOUT;
    feed->Done(p.item, st);
    broken = st != LLM_SUCCESS && !reusable;
    q.pop_front();
    if (broken) break;
  }
  // A broken channel: nothing more is read from it, so the requests still in flight move no byte.
  if (got) q.emplace_back().item = it;
  for (Pending &p : q) {
    ClearLastError();
    feed->Done(p.item, Fail(LLM_LINK_FAILED, "an earlier transfer on the same data channel failed"));
  }
  channels_->Release(fd, !broken);
}

}  // namespace

std::unique_ptr<Path> MakeTcpPath(PeerLink *link, std::shared_ptr<RequestChannels> channels, int64_t remote_cache_id) {
  return std::unique_ptr<Path>(new TcpPath(link, std::move(channels), remote_cache_id));
}

}  // namespace kvblocks
