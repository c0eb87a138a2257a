// SPDX-License-Identifier: Apache-2.0
#include "metrics/stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvblocks {
namespace metrics {

namespace {
const char *const kKindNames[kNumKinds] = {
    "pull_blocks", "push_blocks", "pull_cache", "push_cache", "pull_blocks_async", "push_blocks_async",
    "push_layerwise", "hixl_read", "hixl_write", "hixl_read_async", "hixl_write_async"};

// Names of the LLM_* codes 0x5010B001.. in order (include/llm_datadist/llm_datadist.h).
const char *const kStatusNames[kNumStatus] = {
    "success", "wait_proc_timeout", "kv_cache_not_exist", "repeat_request", "request_already_completed",
    "param_invalid", "engine_finalized", "not_yet_link", "already_link", "link_failed", "unlink_failed",
    "notify_prompt_unlink_failed", "cluster_num_exceed_limit", "processing_link", "device_out_of_memory",
    "prefix_already_exist", "prefix_not_exist", "seq_len_over_limit", "no_free_block", "blocks_out_of_memory",
    "cache_incompatible", "cache_key_already_exist", "copy_cache_failed", "cache_id_already_exist", "exist_link",
    "feature_not_enabled", "timeout", "link_busy", "out_of_memory", "failed", "other", "other"};
constexpr uint32_t kCodeBase = 0x5010B000U;
constexpr int kFailedSlot = 29, kOtherSlot = 30;

// Upper bounds in ns: 10^(3 + i / kPerDecade), rounded.
struct Bounds {
  int64_t ns[kBounds];
  Bounds() {
    for (int i = 0; i < kBounds; ++i) ns[i] = std::llround(std::pow(10.0, 3.0 + static_cast<double>(i) / kPerDecade));
  }
};
const Bounds &TheBounds() {
  static const Bounds b;
  return b;
}
}  // namespace

const char *KindName(Kind k) { return kKindNames[k]; }
bool Inbound(Kind k) {
  return k == kPullBlocks || k == kPullCache || k == kPullBlocksAsync || k == kHixlRead || k == kHixlReadAsync;
}

int StatusSlot(llm_datadist::Status st) {
  if (st == llm_datadist::LLM_SUCCESS) return 0;
  if (st == llm_datadist::LLM_FAILED) return kFailedSlot;
  const uint32_t low = st - kCodeBase;
  return st > kCodeBase && low < static_cast<uint32_t>(kFailedSlot) ? static_cast<int>(low) : kOtherSlot;
}

const char *StatusName(int slot) { return kStatusNames[slot]; }

int BucketOf(int64_t ns) {
  const int64_t *b = TheBounds().ns;
  return static_cast<int>(std::lower_bound(b, b + kBounds, ns) - b);
}

double BoundSeconds(int i) { return static_cast<double>(TheBounds().ns[i]) * 1e-9; }

PeerStats::~PeerStats() {
  for (auto &p : paths) delete p.load();
}

PathStats *PeerStats::Path(const char *name) {
  for (int i = 0; i < kMaxPaths; ++i) {
    PathStats *p = paths[i].load(std::memory_order_acquire);
    if (p == nullptr) {
      auto *mine = new PathStats(name);
      if (paths[i].compare_exchange_strong(p, mine, std::memory_order_acq_rel)) return mine;
      delete mine;  // another thread claimed the slot first: p is its entry
    }
    if (p->name == name || strcmp(p->name, name) == 0 || i == kMaxPaths - 1) return p;
  }
  return nullptr;  // not reached
}

void PeerStats::Finish(const char *path, Kind k, llm_datadist::Status st, uint64_t bytes, int64_t ns) {
  KindStats &s = Path(path)->kinds[k];
  Add(s.status[StatusSlot(st)]);
  if (st == llm_datadist::LLM_SUCCESS) Add(s.bytes, bytes);
  if (ns < 0) ns = 0;
  Add(s.sum_ns, static_cast<uint64_t>(ns));
  Add(s.buckets[BucketOf(ns)]);
}

std::shared_ptr<PeerStats> EngineStats::Peer(uint64_t cluster_id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = peers_.find(cluster_id);
  if (it != peers_.end()) return it->second;
  if (peers_.size() >= kMaxPeers) {
    for (auto i = peers_.begin(); i != peers_.end();) i = i->second.use_count() == 1 ? peers_.erase(i) : std::next(i);
  }
  auto p = std::make_shared<PeerStats>(cluster_id);
  peers_.emplace(cluster_id, p);
  return p;
}

namespace {
uint64_t Get(const Counter &c) { return c.load(std::memory_order_relaxed); }

void SnapshotPaths(const PeerStats &ps, PeerMetrics *out) {
  for (const auto &slot : ps.paths) {
    const PathStats *p = slot.load(std::memory_order_acquire);
    if (p == nullptr) break;
    PathMetrics pm;
    pm.path = p->name;
    pm.in_flight = p->in_flight.load(std::memory_order_relaxed);
    for (int k = 0; k < kNumKinds; ++k) {
      const KindStats &s = p->kinds[k];
      KindMetrics km;
      km.kind = kKindNames[k];
      for (int i = 0; i < kNumStatus; ++i)
        if (uint64_t n = Get(s.status[i])) {
          km.status[kStatusNames[i]] += n;
          km.count += n;
        }
      if (km.count == 0) continue;
      km.bytes = Get(s.bytes);
      km.seconds_sum = static_cast<double>(Get(s.sum_ns)) * 1e-9;
      for (const auto &b : s.buckets) km.buckets.push_back(Get(b));
      (Inbound(static_cast<Kind>(k)) ? pm.bytes_in : pm.bytes_out) += km.bytes;
      auto t = km.status.find("timeout");
      if (t != km.status.end()) out->timeouts += t->second;
      pm.kinds.push_back(std::move(km));
    }
    out->paths.push_back(std::move(pm));
  }
}

PeerMetrics SnapshotPeer(const PeerStats &ps) {
  PeerMetrics m;
  m.cluster_id = ps.cluster_id;
  m.links = Get(ps.links);
  m.relinks = Get(ps.relinks);
  m.unlinks = Get(ps.unlinks);
  m.link_failures = Get(ps.link_failures);
  m.link_breaks = Get(ps.link_breaks);
  m.notifies_sent = Get(ps.notifies_sent);
  m.notifies_received = Get(ps.notifies_received);
  m.crc_mismatches = Get(ps.crc_mismatches);
  SnapshotPaths(ps, &m);
  return m;
}
}  // namespace

void EngineStats::Snapshot(EngineMetrics *out, const std::map<uint64_t, int> &live_channels) const {
  for (int i = 0; i < kBounds; ++i) out->bucket_bounds.push_back(BoundSeconds(i));
  std::lock_guard<std::mutex> g(mu_);
  for (const auto &kv : peers_) {
    PeerMetrics m = SnapshotPeer(*kv.second);
    auto it = live_channels.find(kv.first);
    m.linked = it != live_channels.end();
    if (m.linked) m.data_channels = it->second;
    out->peers.push_back(std::move(m));
  }
  PeerMetrics none = SnapshotPeer(none_);
  none.unlinked_peer = true;
  if (!none.paths.empty()) out->peers.push_back(std::move(none));
}

}  // namespace metrics
}  // namespace kvblocks
