// SPDX-License-Identifier: Apache-2.0
// Pull/Push/Copy: argument checks in CANN's order, then one plan executed on the link's path.
// Every check runs before the first byte moves, so a failed call changes no memory.
#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <thread>

#include "runtime.h"

namespace kvblocks {
namespace {

inline int64_t DeadlineFrom(int64_t ms) { return NowNs() + ms * 1000000LL; }


// memcpy over every (tensor pair in [begin, end), segment); src/dst bases indexed by tensor.
Status CopyRange(const Plan &plan, uint8_t *const *src, uint8_t *const *dst, int64_t deadline, size_t begin,
                 size_t end) {
  for (size_t i = begin; i < end; ++i) {
    if (deadline != 0 && (i & 15) == 15 && NowNs() > deadline) return LLM_TIMEOUT;
    const uint8_t *s = src[plan.src_tensors[i]];
    uint8_t *d = dst[plan.dst_tensors[i]];
    for (const Segment &g : plan.segs) memcpy(d + g.dst_off, s + g.src_off, g.len);
  }
  return LLM_SUCCESS;
}

Status CmaRange(const Plan &plan, pid_t pid, const std::vector<uint64_t> &remote, const std::vector<uint64_t> &local,
                bool pull, int64_t deadline, size_t begin, size_t end) {
  std::vector<iovec> liov, riov;
  liov.reserve(IOV_MAX);
  riov.reserve(IOV_MAX);
  auto flush = [&]() -> Status {
    size_t expect = 0;
    for (const auto &v : liov) expect += v.iov_len;
    const ssize_t n = pull ? process_vm_readv(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0)
                           : process_vm_writev(pid, liov.data(), liov.size(), riov.data(), riov.size(), 0);
    liov.clear();
    riov.clear();
    if (n == static_cast<ssize_t>(expect)) return LLM_SUCCESS;
    if (n < 0 && errno == ESRCH) return LLM_LINK_FAILED;  // the peer process is gone
    return LLM_FAILED;
  };
  for (size_t i = begin; i < end; ++i) {
    const uint64_t rbase = remote[pull ? plan.src_tensors[i] : plan.dst_tensors[i]];
    uint8_t *lbase = reinterpret_cast<uint8_t *>(local[pull ? plan.dst_tensors[i] : plan.src_tensors[i]]);
    for (const Segment &g : plan.segs) {
      const uint64_t roff = pull ? g.src_off : g.dst_off, loff = pull ? g.dst_off : g.src_off;
      liov.push_back(iovec{lbase + loff, g.len});
      riov.push_back(iovec{reinterpret_cast<void *>(rbase + roff), g.len});
      if (liov.size() == IOV_MAX) {
        const Status st = flush();
        if (st != LLM_SUCCESS) return st;
        if (NowNs() > deadline) return LLM_TIMEOUT;
      }
    }
  }
  return liov.empty() ? LLM_SUCCESS : flush();
}

// Large one-sided copies are split by tensor pairs over a few threads: on this kind of machine one
// core cannot saturate memory bandwidth with 64 KiB copies. Small ones stay on the caller's thread.
constexpr uint64_t kParallelBytes = 8ULL << 20;

template <typename Fn>
Status RunSplit(const Plan &plan, Fn &&fn) {
  const size_t n = plan.src_tensors.size();
  static const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t parts = plan.total_bytes() < kParallelBytes ? 1 : std::min<size_t>({hw, 4, n});
  if (parts <= 1) return fn(0, n);
  std::vector<Status> st(parts, LLM_SUCCESS);
  std::vector<std::thread> threads;
  threads.reserve(parts - 1);
  for (size_t k = 1; k < parts; ++k)
    threads.emplace_back([&, k] { st[k] = fn(n * k / parts, n * (k + 1) / parts); });
  st[0] = fn(0, n / parts);
  for (auto &t : threads) t.join();
  for (Status x : st)
    if (x != LLM_SUCCESS) return x;
  return LLM_SUCCESS;
}

Status CopyPlan(const Plan &plan, uint8_t *const *src, uint8_t *const *dst, int64_t deadline) {
  return RunSplit(plan, [&](size_t b, size_t e) { return CopyRange(plan, src, dst, deadline, b, e); });
}

Status CmaPlan(const Plan &plan, pid_t pid, const std::vector<uint64_t> &remote, const std::vector<uint64_t> &local,
               bool pull, int64_t deadline) {
  return RunSplit(plan, [&](size_t b, size_t e) { return CmaRange(plan, pid, remote, local, pull, deadline, b, e); });
}

Status FromIo(IoResult r) {
  switch (r) {
    case IoResult::kOk:
      return LLM_SUCCESS;
    case IoResult::kTimeout:
      return LLM_TIMEOUT;
    default:
      return LLM_LINK_FAILED;
  }
}

}  // namespace

Status Impl::ExecuteTcp(const std::shared_ptr<struct Link> &link, const RemoteCache &rc, const CacheEntry &lc,
                        const Plan &plan, bool pull, int64_t deadline) {
  Status st;
  const int fd = AcquireChannel(link, deadline, &st);
  if (fd < 0) return st;
  const uint64_t total = plan.total_bytes();
  Writer w;
  w.buf.reserve(32 + plan.src_tensors.size() * 4 + plan.segs.size() * 16);
  w.Put<int64_t>(rc.id);
  w.Put<int64_t>(deadline + link->clock_offset_ns);
  w.Put<int64_t>(std::max<int64_t>(deadline - NowNs(), 1));  // budget: immune to clock drift
  w.Put<uint32_t>(static_cast<uint32_t>(plan.src_tensors.size()));
  w.Put<uint32_t>(static_cast<uint32_t>(plan.segs.size()));
  w.Put<uint64_t>(total);
  for (size_t i = 0; i < plan.src_tensors.size(); ++i)
    w.Put<uint32_t>(pull ? plan.src_tensors[i] : plan.dst_tensors[i]);
  for (const Segment &g : plan.segs) {
    w.Put<uint64_t>(pull ? g.src_off : g.dst_off);
    w.Put<uint64_t>(g.len);
  }
  // Local side of the stream, in the order the peer gathers or scatters it.
  std::vector<iovec> iov;
  iov.reserve(plan.src_tensors.size() * plan.segs.size() + 2);
  FrameHeader req{kMagic, static_cast<uint16_t>(pull ? kReadReq : kWriteReq), 0, 0, 0, w.buf.size()};
  const bool inline_data = !pull && total <= kMaxInlineWrite;
  if (inline_data) req.flags = 1;
  iov.push_back(iovec{&req, sizeof(req)});
  iov.push_back(iovec{&w.buf[0], w.buf.size()});
  const size_t head = iov.size();
  for (size_t i = 0; i < plan.src_tensors.size(); ++i) {
    uint8_t *base = reinterpret_cast<uint8_t *>(lc.addrs[pull ? plan.dst_tensors[i] : plan.src_tensors[i]]);
    for (const Segment &g : plan.segs) AppendIov(&iov, base + (pull ? g.dst_off : g.src_off), g.len);
  }

  auto finish = [&](Status s, bool reusable) {
    ReleaseChannel(link, fd, reusable);
    // A timed-out or broken stream leaves the link unusable, as in CANN: re-link to recover.
    if (s == LLM_TIMEOUT || s == LLM_LINK_FAILED) FailLink(link);
    return s;
  };
  IoResult r;
  FrameHeader h;
  if (pull) {
    r = SendIov(fd, iov.data(), head, deadline);
    if (r != IoResult::kOk) return finish(FromIo(r), false);
    r = RecvHeader(fd, &h, deadline);
    if (r != IoResult::kOk) return finish(FromIo(r), false);
    if (h.type != kReadResp) return finish(LLM_LINK_FAILED, false);
    if (h.status != LLM_SUCCESS) return finish(h.status, h.length == 0);
    if (h.length != total) return finish(LLM_LINK_FAILED, false);
    r = RecvIov(fd, iov.data() + head, iov.size() - head, deadline);
    return finish(FromIo(r), r == IoResult::kOk);
  }
  if (inline_data) {
    r = SendIov(fd, iov.data(), iov.size(), deadline);
  } else {
    r = SendIov(fd, iov.data(), head, deadline);
    if (r != IoResult::kOk) return finish(FromIo(r), false);
    r = RecvHeader(fd, &h, deadline);
    if (r != IoResult::kOk) return finish(FromIo(r), false);
    if (h.type != kWriteReady) return finish(LLM_LINK_FAILED, false);
    if (h.status != LLM_SUCCESS) return finish(h.status, h.length == 0);
    r = SendIov(fd, iov.data() + head, iov.size() - head, deadline);
  }
  if (r != IoResult::kOk) return finish(FromIo(r), false);
  r = RecvHeader(fd, &h, deadline);
  if (r != IoResult::kOk) return finish(FromIo(r), false);
  if (h.type != kWriteDone) return finish(LLM_LINK_FAILED, false);
  return finish(h.status, h.length == 0);
}

Status Impl::ExecuteRemote(const std::shared_ptr<struct Link> &link, const RemoteCache &rc, const CacheEntry &lc,
                           const Plan &plan, bool pull, int64_t deadline) {
  if (!link->force_tcp) {
    if (!rc.view.empty()) {
      uint8_t *const *remote = rc.view.data();
      uint8_t *const *local = reinterpret_cast<uint8_t *const *>(lc.addrs.data());
      const Status st = pull ? CopyPlan(plan, remote, local, deadline) : CopyPlan(plan, local, remote, deadline);
      if (st == LLM_TIMEOUT) FailLink(link);
      return st;
    }
    if (rc.cma) {
      const Status st = CmaPlan(plan, static_cast<pid_t>(link->peer.pid), rc.addrs, lc.addrs, pull, deadline);
      if (st == LLM_TIMEOUT || st == LLM_LINK_FAILED) FailLink(link);
      return st;
    }
  }
  return ExecuteTcp(link, rc, lc, plan, pull, deadline);
}

// ------------------------------------------------------------------ blocks
Status Impl::PullBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  const int64_t deadline = DeadlineFrom(wait_time_ms_);
  if (CheckRole(true) != LLM_SUCCESS) return LLM_PARAM_INVALID;
  if (src.batch_index != 0) return LLM_PARAM_INVALID;
  if (!LayerRangeValid(ext.src_layer_range.first, ext.src_layer_range.second) ||
      !LayerRangeValid(ext.dst_layer_range.first, ext.dst_layer_range.second) || ext.tensor_num_per_layer == 0)
    return LLM_PARAM_INVALID;
  if (src_blocks.empty() || src_blocks.size() != dst_blocks.size()) return LLM_PARAM_INVALID;
  if (src.cluster_id == cluster_id_) return LLM_PARAM_INVALID;
  auto lc = FindCache(dst.cache_id);
  if (!lc) return LLM_KV_CACHE_NOT_EXIST;
  if (lc->kind == CacheKind::kCache) return LLM_PARAM_INVALID;
  bool explicit_range;
  TensorSpan span;
  if (PullTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                     ext.dst_layer_range.second, ext.tensor_num_per_layer, lc->num_tensors, &explicit_range,
                     &span) != RuleError::kOk)
    return LLM_PARAM_INVALID;
  auto link = FindLink(src.cluster_id);
  if (!link || !link->alive.load()) return LLM_NOT_YET_LINK;
  if (FirstOutOfRange(dst_blocks.data(), dst_blocks.size(), lc->num_blocks) != dst_blocks.size())
    return LLM_PARAM_INVALID;
  auto it = link->caches.find(src.cache_id);
  if (src.cache_id <= 0 || it == link->caches.end()) return LLM_KV_CACHE_NOT_EXIST;
  const RemoteCache &rc = it->second;
  RemoteUse remote_use(rc);
  if (!remote_use.ok) return LLM_KV_CACHE_NOT_EXIST;  // the peer unregistered it
  if (rc.kind == CacheKind::kCache) return LLM_PARAM_INVALID;
  if (explicit_range ? span.src_begin + span.count > rc.num_tensors : rc.num_tensors != lc->num_tensors)
    return LLM_PARAM_INVALID;
  if (FirstOutOfRange(src_blocks.data(), src_blocks.size(), rc.num_blocks) != src_blocks.size())
    return LLM_PARAM_INVALID;
  if (rc.stride != lc->stride) return LLM_PARAM_INVALID;

  Plan plan;
  plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  BuildBlockSegments(src_blocks, dst_blocks, lc->stride, &plan);
  CacheUse use(*lc);
  if (!use.ok) return LLM_KV_CACHE_NOT_EXIST;
  return ExecuteRemote(link, rc, *lc, plan, true, deadline);
}

Status Impl::PushBlocks(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  const int64_t deadline = DeadlineFrom(wait_time_ms_);
  if (CheckRole(false) != LLM_SUCCESS) return LLM_PARAM_INVALID;
  if (src.cache_desc.placement != CachePlacement::kDevice) return LLM_PARAM_INVALID;
  if (src_blocks.empty() || src_blocks.size() != dst_blocks.size()) return LLM_PARAM_INVALID;
  if (dst.batch_index != 0) return LLM_PARAM_INVALID;
  if (PushRangesValid(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                      ext.dst_layer_range.second, src.cache_desc.num_tensors) != RuleError::kOk)
    return LLM_PARAM_INVALID;
  if (ext.tensor_num_per_layer == 0) return LLM_PARAM_INVALID;
  auto lc = FindCache(src.cache_id);
  if (!lc) return LLM_KV_CACHE_NOT_EXIST;
  auto link = FindLink(dst.cluster_id);
  if (!link || !link->alive.load()) return LLM_NOT_YET_LINK;
  auto it = link->caches.find(dst.cache_id);
  if (dst.cache_id <= 0 || it == link->caches.end()) return LLM_KV_CACHE_NOT_EXIST;
  const RemoteCache &rc = it->second;
  RemoteUse remote_use(rc);
  if (!remote_use.ok) return LLM_KV_CACHE_NOT_EXIST;  // the peer unregistered it
  if (rc.kind == CacheKind::kCache) return LLM_PARAM_INVALID;
  TensorSpan span;
  if (PushTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                     ext.tensor_num_per_layer, lc->num_tensors, rc.num_tensors, &span) != RuleError::kOk)
    return LLM_PARAM_INVALID;
  if (FirstOutOfRange(dst_blocks.data(), dst_blocks.size(), rc.num_blocks) != dst_blocks.size())
    return LLM_PARAM_INVALID;
  if (lc->kind == CacheKind::kCache) return LLM_PARAM_INVALID;
  if (FirstOutOfRange(src_blocks.data(), src_blocks.size(), lc->num_blocks) != src_blocks.size())
    return LLM_PARAM_INVALID;
  if (rc.stride != lc->stride) return LLM_PARAM_INVALID;

  Plan plan;
  plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  BuildBlockSegments(src_blocks, dst_blocks, lc->stride, &plan);
  CacheUse use(*lc);
  if (!use.ok) return LLM_KV_CACHE_NOT_EXIST;
  return ExecuteRemote(link, rc, *lc, plan, false, deadline);
}

// ------------------------------------------------------------------ batches
Status Impl::PullCache(const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  const int64_t deadline = DeadlineFrom(wait_time_ms_);
  if (CheckRole(true) != LLM_SUCCESS) return LLM_PARAM_INVALID;
  if (size != -1 && size <= 0) return LLM_PARAM_INVALID;
  if (!LayerRangeValid(ext.src_layer_range.first, ext.src_layer_range.second) ||
      !LayerRangeValid(ext.dst_layer_range.first, ext.dst_layer_range.second) || ext.tensor_num_per_layer == 0)
    return LLM_PARAM_INVALID;
  if (src.cluster_id == cluster_id_) return LLM_PARAM_INVALID;
  auto lc = FindCache(dst.cache_id);
  if (!lc) return LLM_KV_CACHE_NOT_EXIST;
  if (batch_index >= lc->batch_size) return LLM_PARAM_INVALID;
  if (size > 0 && static_cast<uint64_t>(size) > lc->stride) return LLM_PARAM_INVALID;
  bool explicit_range;
  TensorSpan span;
  if (PullTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                     ext.dst_layer_range.second, ext.tensor_num_per_layer, lc->num_tensors, &explicit_range,
                     &span) != RuleError::kOk)
    return LLM_PARAM_INVALID;
  auto link = FindLink(src.cluster_id);
  if (!link || !link->alive.load()) return LLM_NOT_YET_LINK;
  auto it = link->caches.find(src.cache_id);
  if (src.cache_id <= 0 || it == link->caches.end()) return LLM_KV_CACHE_NOT_EXIST;
  const RemoteCache &rc = it->second;
  RemoteUse remote_use(rc);
  if (!remote_use.ok) return LLM_KV_CACHE_NOT_EXIST;  // the peer unregistered it
  if (explicit_range ? span.src_begin + span.count > rc.num_tensors : rc.num_tensors != lc->num_tensors)
    return LLM_PARAM_INVALID;
  if (src.batch_index >= rc.batch_size) return LLM_KV_CACHE_NOT_EXIST;
  const uint64_t len = size == -1 ? lc->stride : static_cast<uint64_t>(size);
  if (len > rc.stride) return LLM_PARAM_INVALID;

  Plan plan;
  plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  plan.segs.push_back(Segment{src.batch_index * rc.stride, batch_index * lc->stride, len});
  plan.bytes_per_tensor = len;
  CacheUse use(*lc);
  if (!use.ok) return LLM_KV_CACHE_NOT_EXIST;
  return ExecuteRemote(link, rc, *lc, plan, true, deadline);
}

Status Impl::PushCache(const Cache &src, const CacheIndex &dst, uint32_t src_batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  const int64_t deadline = DeadlineFrom(wait_time_ms_);
  if (CheckRole(false) != LLM_SUCCESS) return LLM_PARAM_INVALID;
  if (src.cache_desc.placement != CachePlacement::kDevice) return LLM_PARAM_INVALID;
  if (size != -1) return LLM_PARAM_INVALID;
  if (PushRangesValid(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                      ext.dst_layer_range.second, src.cache_desc.num_tensors) != RuleError::kOk)
    return LLM_PARAM_INVALID;
  if (ext.tensor_num_per_layer == 0) return LLM_PARAM_INVALID;
  auto lc = FindCache(src.cache_id);
  if (!lc) return LLM_KV_CACHE_NOT_EXIST;
  auto link = FindLink(dst.cluster_id);
  if (!link || !link->alive.load()) return LLM_NOT_YET_LINK;
  auto it = link->caches.find(dst.cache_id);
  if (dst.cache_id <= 0 || it == link->caches.end()) return LLM_KV_CACHE_NOT_EXIST;
  const RemoteCache &rc = it->second;
  RemoteUse remote_use(rc);
  if (!remote_use.ok) return LLM_KV_CACHE_NOT_EXIST;  // the peer unregistered it
  if (dst.batch_index >= rc.batch_size) return LLM_PARAM_INVALID;
  TensorSpan span;
  if (PushTensorSpan(ext.src_layer_range.first, ext.src_layer_range.second, ext.dst_layer_range.first,
                     ext.tensor_num_per_layer, lc->num_tensors, rc.num_tensors, &span) != RuleError::kOk)
    return LLM_PARAM_INVALID;
  if (src_batch_index >= lc->batch_size) return LLM_PARAM_INVALID;
  if (lc->stride > rc.stride) return LLM_PARAM_INVALID;

  Plan plan;
  plan.PairTensors(span.src_begin, span.dst_begin, span.count);
  plan.segs.push_back(Segment{src_batch_index * lc->stride, dst.batch_index * rc.stride, lc->stride});
  plan.bytes_per_tensor = lc->stride;
  CacheUse use(*lc);
  if (!use.ok) return LLM_KV_CACHE_NOT_EXIST;
  return ExecuteRemote(link, rc, *lc, plan, false, deadline);
}

// ------------------------------------------------------------------ local copies (CANN V1 rules)
Status Impl::CopyBlocks(const Cache &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<std::vector<uint64_t>> &dst_lists) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  if (src_blocks.empty() || dst_lists.empty()) return LLM_PARAM_INVALID;
  auto s = FindCache(src.cache_id);
  auto d = FindCache(dst.cache_id);
  if (!s || !d) return LLM_KV_CACHE_NOT_EXIST;
  if (s->kind == CacheKind::kCache || d->kind == CacheKind::kCache) return LLM_PARAM_INVALID;
  if (s->stride != d->stride || s->num_tensors != d->num_tensors) return LLM_PARAM_INVALID;
  if (s->desc.placement == CachePlacement::kHost && d->desc.placement == CachePlacement::kHost)
    return LLM_PARAM_INVALID;
  if (FirstOutOfRange(src_blocks.data(), src_blocks.size(), s->num_blocks) != src_blocks.size())
    return LLM_PARAM_INVALID;
  for (const auto &l : dst_lists)
    if (l.size() != src_blocks.size() || FirstOutOfRange(l.data(), l.size(), d->num_blocks) != l.size())
      return LLM_PARAM_INVALID;
  CacheUse us(*s);
  std::unique_ptr<CacheUse> ud(d != s ? new CacheUse(*d) : nullptr);
  if (!us.ok || (ud && !ud->ok)) return LLM_KV_CACHE_NOT_EXIST;
  for (const auto &l : dst_lists) {
    Plan plan;
    plan.PairTensors(0, 0, s->num_tensors);
    BuildBlockSegments(src_blocks, l, s->stride, &plan);
    CopyPlan(plan, reinterpret_cast<uint8_t *const *>(s->addrs.data()),
             reinterpret_cast<uint8_t *const *>(d->addrs.data()), 0);
  }
  return LLM_SUCCESS;
}

Status Impl::CopyCache(const Cache &src, const Cache &dst, uint32_t src_batch, uint32_t dst_batch, uint64_t offset,
                       int64_t size) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  if (size != -1 && size <= 0) return LLM_PARAM_INVALID;
  auto s = FindCache(src.cache_id);
  auto d = FindCache(dst.cache_id);
  if (!s || !d) return LLM_KV_CACHE_NOT_EXIST;
  if (s->desc.placement == CachePlacement::kHost) return LLM_PARAM_INVALID;
  if (s->num_tensors != d->num_tensors) return LLM_PARAM_INVALID;
  if (src_batch >= s->batch_size || dst_batch >= d->batch_size) return LLM_PARAM_INVALID;
  const uint64_t stride = std::min(s->stride, d->stride);
  if (offset >= stride) return LLM_PARAM_INVALID;
  const uint64_t len = size == -1 ? stride - offset : static_cast<uint64_t>(size);
  if (len > stride - offset) return LLM_PARAM_INVALID;
  CacheUse us(*s);
  std::unique_ptr<CacheUse> ud(d != s ? new CacheUse(*d) : nullptr);
  if (!us.ok || (ud && !ud->ok)) return LLM_KV_CACHE_NOT_EXIST;
  Plan plan;
  plan.PairTensors(0, 0, s->num_tensors);
  plan.segs.push_back(Segment{src_batch * s->stride + offset, dst_batch * d->stride + offset, len});
  // memmove semantics are not needed: CANN forbids overlapping copies within one cache row.
  return CopyPlan(plan, reinterpret_cast<uint8_t *const *>(s->addrs.data()),
                  reinterpret_cast<uint8_t *const *>(d->addrs.data()), 0);
}

// ------------------------------------------------------------------ extensions
Status Impl::FindRemoteCache(uint64_t cluster_id, int64_t key, int64_t *cache_id) {
  auto link = FindLink(cluster_id);
  if (!link || !link->alive.load()) return LLM_NOT_YET_LINK;
  for (const auto &kv : link->caches)
    if (kv.second.key == key) {
      *cache_id = kv.first;
      return LLM_SUCCESS;
    }
  return LLM_KV_CACHE_NOT_EXIST;
}

std::string Impl::LinkPath(uint64_t cluster_id) {
  auto link = FindLink(cluster_id);
  if (!link || !link->alive.load()) return "";
  if (link->force_tcp) return "tcp";
  if (link->same_process) return "inprocess";
  bool any_cma = false, any_shm = false;
  for (const auto &kv : link->caches) {
    any_cma |= kv.second.cma;
    any_shm |= !kv.second.view.empty();
  }
  if (any_cma && !any_shm) return "cma";
  if (any_cma) return "shm+cma";
  return "shm";
}

std::shared_ptr<void> Impl::PinCacheMemory(int64_t cache_id) {
  auto e = FindCache(cache_id);
  return e ? std::shared_ptr<void>(e->region) : nullptr;
}

int Impl::LinkChannels(uint64_t cluster_id) {
  auto link = FindLink(cluster_id);
  if (!link) return 0;
  std::lock_guard<std::mutex> g(link->mu);
  return static_cast<int>(link->fds.size());
}

}  // namespace kvblocks
