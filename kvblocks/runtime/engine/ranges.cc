// SPDX-License-Identifier: Apache-2.0
// Address-based transfers (hixl): (local address, remote address, length) ranges. A registered
// memory region is a one-tensor cache; each range is cut at region boundaries on both sides into
// (local cache, remote cache, offset, length) pieces, one Plan per cache pair. Every range is
// checked against this engine's registrations and the peer's link-time table before any byte moves.
#include <algorithm>

#include "common/error.h"
#include "common/util.h"
#include "engine/async.h"
#include "engine/checks.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/transfer.h"

namespace kvblocks {

namespace {

// A registered region [begin, end) and who owns it.
struct Span {
  uint64_t begin, end;
  const void *owner;  // ours: CacheEntry; theirs: RemoteCache
};

bool ByBegin(const Span &a, const Span &b) { return a.begin < b.begin; }

// The span holding `addr`, or null.
const Span *Holding(const std::vector<Span> &spans, uint64_t addr) {
  auto it = std::upper_bound(spans.begin(), spans.end(), Span{addr, 0, nullptr}, ByBegin);
  if (it == spans.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

// One-tensor caches (registered regions) of this engine, by address; run under the registry lock.
void LocalSpans(const std::map<int64_t, std::shared_ptr<CacheEntry>> &all, std::vector<Span> *out) {
  out->reserve(all.size());
  for (const auto &kv : all) {
    const CacheEntry &e = *kv.second;
    if (e.num_tensors == 1 && !e.closing.load()) out->push_back(Span{e.addrs[0], e.addrs[0] + e.tensor_bytes, &e});
  }
  std::sort(out->begin(), out->end(), ByBegin);
}

// The peer's one-tensor caches by announced address (fixed for the link's life: built once).
const std::vector<std::pair<uint64_t, const RemoteCache *>> &RemoteByAddr(struct Link &link) {
  std::call_once(link.by_addr_once, [&link] {
    for (const auto &kv : link.caches) {
      const RemoteCache &rc = kv.second;
      uint64_t end;
      if (rc.num_tensors == 1 && rc.addrs.size() == 1 && !__builtin_add_overflow(rc.addrs[0], rc.tensor_bytes, &end))
        link.by_addr.emplace_back(rc.addrs[0], &rc);
    }
    std::sort(link.by_addr.begin(), link.by_addr.end());
  });
  return link.by_addr;
}

// The remote cache holding `addr` and its span, or null.
const RemoteCache *RemoteHolding(const std::vector<std::pair<uint64_t, const RemoteCache *>> &by_addr, uint64_t addr,
                                 uint64_t *begin, uint64_t *end) {
  auto it = std::upper_bound(by_addr.begin(), by_addr.end(), std::make_pair(addr, static_cast<const RemoteCache *>(nullptr)),
                             [](const std::pair<uint64_t, const RemoteCache *> &a,
                                const std::pair<uint64_t, const RemoteCache *> &b) { return a.first < b.first; });
  if (it == by_addr.begin()) return nullptr;
  --it;
  *begin = it->first;
  *end = it->first + it->second->tensor_bytes;
  return addr < *end ? it->second : nullptr;
}

Status Outside(size_t i, const char *side, uint64_t addr, const char *whose) {
  return Fail(LLM_PARAM_INVALID, "ranges[%zu]: %s address 0x%llx is not in memory %s registered", i, side,
              static_cast<unsigned long long>(addr), whose);
}

// Appends a piece to a plan, extending its last segment when the piece continues it.
void AddPiece(Plan *plan, uint64_t src_off, uint64_t dst_off, uint64_t len) {
  if (!plan->segs.empty()) {
    Segment &g = plan->segs.back();
    if (g.src_off + g.len == src_off && g.dst_off + g.len == dst_off) {
      g.len += len;
      plan->bytes_per_tensor += len;
      return;
    }
  }
  plan->AddRange(src_off, dst_off, len);
}

// Cuts one range at region boundaries on both sides (adjacent registrations together cover a
// range) and appends the pieces to the plan of their (local, remote) pair.
template <typename Group>
Status CutRange(const AddrRange &r, size_t i, bool read, const std::vector<Span> &mine,
                const std::vector<std::pair<uint64_t, const RemoteCache *>> &theirs, Group &&group) {
  uint64_t end;
  if (r.len == 0) return Fail(LLM_PARAM_INVALID, "ranges[%zu]: len is 0", i);
  if (__builtin_add_overflow(r.local, r.len, &end) || __builtin_add_overflow(r.remote, r.len, &end))
    return Fail(LLM_PARAM_INVALID, "ranges[%zu]: address + len %llu overflows", i, static_cast<unsigned long long>(r.len));
  for (uint64_t done = 0; done < r.len;) {
    const uint64_t la = r.local + done, ra = r.remote + done;
    const Span *l = Holding(mine, la);
    if (!l) return Outside(i, "local", la, "this engine");
    uint64_t rb, re;
    const RemoteCache *rc = RemoteHolding(theirs, ra, &rb, &re);
    if (!rc) return Outside(i, "remote", ra, "the peer had (when linked)");
    const uint64_t piece = std::min({r.len - done, l->end - la, re - ra});
    Transfer *g = group(static_cast<const CacheEntry *>(l->owner), rc);
    const uint64_t lo = la - l->begin, ro = ra - rb;
    if (read) AddPiece(&g->plan, ro, lo, piece);
    else AddPiece(&g->plan, lo, ro, piece);
    done += piece;
  }
  return LLM_SUCCESS;
}

}  // namespace

Status Impl::PrepareRanges(Transfer *t, uint64_t cluster_id, bool read, const AddrRange *ranges, size_t n,
                           int64_t deadline) {
  t->state = std::shared_lock<std::shared_mutex>(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  t->deadline = deadline;
  for (size_t i = 0; i < n; ++i)
    if (ranges[i].local == 0 || ranges[i].remote == 0)
      return Fail(LLM_PARAM_INVALID, "ranges[%zu]: the %s address is 0", i, ranges[i].local == 0 ? "local" : "remote");
  Status st;
  if ((st = checks_->FindLink(t, cluster_id)) != LLM_SUCCESS) return st;
  if (n == 0) return Fail(LLM_PARAM_INVALID, "no ranges given");
  const auto &theirs = RemoteByAddr(*t->link);
  std::vector<Transfer *> groups;  // t first, then t->rest
  st = LLM_SUCCESS;
  // Under the registry lock, so our entries stay alive until the groups hold them.
  caches_.Visit([&](const std::map<int64_t, std::shared_ptr<CacheEntry>> &all) {
    std::vector<Span> mine;
    LocalSpans(all, &mine);
    auto group = [&](const CacheEntry *l, const RemoteCache *r) -> Transfer * {
      for (Transfer *g : groups)
        if (g->local.get() == l && g->remote == r) return g;
      Transfer *g = t;
      if (!groups.empty()) {
        t->rest.push_back(NewTransfer());
        g = t->rest.back().get();
        g->deadline = deadline;
        g->link = t->link;
      }
      g->local = all.at(l->id);
      g->remote = r;
      g->plan.PairTensors(0, 0, 1);
      if (groups.empty()) g->plan.segs.reserve(n);  // usually the only group: no regrowth
      groups.push_back(g);
      return g;
    };
    for (size_t i = 0; i < n && st == LLM_SUCCESS; ++i) st = CutRange(ranges[i], i, read, mine, theirs, group);
  });
  if (st != LLM_SUCCESS) return st;
  t->remote_use.reset(new RemoteUse(*t->remote));
  if (!t->remote_use->ok) return Fail(LLM_PARAM_INVALID, "the peer deregistered memory these ranges use");
  return LLM_SUCCESS;
}

Status Impl::TransferRanges(uint64_t cluster_id, bool read, const AddrRange *ranges, size_t n, int64_t timeout_ms) {
  const int64_t ms = timeout_ms < 0 ? wait_time_ms_ : timeout_ms;
  Transfer t;
  t.kind = read ? metrics::kHixlRead : metrics::kHixlWrite;
  t.start_ns = NowNs();
  const Status st = PrepareRanges(&t, cluster_id, read, ranges, n, t.start_ns + ms * kMsNs);
  return exec_->Tally(&t, st != LLM_SUCCESS ? st : exec_->Run(&t, read));
}

Status Impl::SubmitRanges(uint64_t cluster_id, bool read, const AddrRange *ranges, size_t n, int64_t timeout_ms,
                          TransferHandle *out) {
  const int64_t budget = timeout_ms < 0 ? kRangesAsyncDeadlineNs : timeout_ms * kMsNs;
  TransferPtr t = NewTransfer();
  t->kind = read ? metrics::kHixlReadAsync : metrics::kHixlWriteAsync;
  t->start_ns = NowNs();
  const Status st = PrepareRanges(t.get(), cluster_id, read, ranges, n, t->start_ns + budget);
  if (st != LLM_SUCCESS) return exec_->Tally(t.get(), st);
  Executor::Detach(t.get());
  async_->Submit(std::move(t), read, out);
  return LLM_SUCCESS;
}

}  // namespace kvblocks
