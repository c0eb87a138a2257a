// SPDX-License-Identifier: Apache-2.0
// The engine's counters behind include/kvblocks/metrics.h. The transfer path only adds to relaxed
// atomics in slots reached by pointer (a peer's slots are made at link time, a path's on its first
// transfer without a lock); the registry's mutex is taken when a peer first appears and on snapshot.
#ifndef KVBLOCKS_RUNTIME_METRICS_STATS_H_
#define KVBLOCKS_RUNTIME_METRICS_STATS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "kvblocks/metrics.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {
namespace metrics {

enum Kind : uint8_t {
  kPullBlocks, kPushBlocks, kPullCache, kPushCache, kPullBlocksAsync, kPushBlocksAsync, kPushLayerwise,
  kHixlRead, kHixlWrite, kHixlReadAsync, kHixlWriteAsync, kNumKinds
};
const char *KindName(Kind k);
bool Inbound(Kind k);  // bytes land in this engine (pull, read)

constexpr int kPerDecade = 4;
constexpr int kBounds = 8 * kPerDecade + 1;  // 1 us .. 100 s, log-spaced
constexpr int kNumStatus = 32;               // 0 success, 1..28 LLM_* codes 0x5010B0nn, 29 failed, 30 other
int StatusSlot(llm_datadist::Status st);
const char *StatusName(int slot);
int BucketOf(int64_t ns);  // 0..kBounds (kBounds: +Inf)
double BoundSeconds(int i);

using Counter = std::atomic<uint64_t>;
inline void Add(Counter &c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }

struct KindStats {
  Counter status[kNumStatus] = {};
  Counter bytes{0};
  Counter sum_ns{0};
  Counter buckets[kBounds + 1] = {};
};

struct PathStats {
  explicit PathStats(const char *n) : name(n) {}
  const char *const name;  // a Path's name(): a string that lives as long as the program
  std::atomic<int64_t> in_flight{0};
  KindStats kinds[kNumKinds];
};

struct PeerStats {
  static constexpr int kMaxPaths = 8;
  explicit PeerStats(uint64_t id) : cluster_id(id) {}
  ~PeerStats();
  const uint64_t cluster_id;
  Counter links{0}, relinks{0}, unlinks{0}, link_failures{0}, link_breaks{0};
  Counter notifies_sent{0}, notifies_received{0};
  Counter crc_mismatches{0};  // kvblocks.Integrity: segments whose CRC32C did not match (either side)
  std::atomic<PathStats *> paths[kMaxPaths] = {};
  // The slot of the path named `name`, made on first use (a compare-and-swap, no lock); the last
  // slot is shared by any further names.
  PathStats *Path(const char *name);
  void OnLinked() {
    if (links.fetch_add(1, std::memory_order_relaxed) > 0) Add(relinks);
  }
  // One finished transfer; `ns` from its start.
  void Finish(const char *path, Kind k, llm_datadist::Status st, uint64_t bytes, int64_t ns);
};

// A transfer moving bytes on a path (in_flight) for the life of this object.
class Busy {
 public:
  explicit Busy(PathStats *p) : p_(p) { Enter(p); }
  ~Busy() { Leave(p_); }
  Busy(const Busy &) = delete;
  Busy &operator=(const Busy &) = delete;
  static void Enter(PathStats *p) { p->in_flight.fetch_add(1, std::memory_order_relaxed); }
  static void Leave(PathStats *p) { p->in_flight.fetch_sub(1, std::memory_order_relaxed); }

 private:
  PathStats *const p_;
};

// One engine's peers; the peer of cluster id X keeps its counters across links to X.
class EngineStats {
 public:
  std::shared_ptr<PeerStats> Peer(uint64_t cluster_id);  // made when new (takes the mutex)
  PeerStats &none() { return none_; }  // transfers that failed before they had a link
  // Every peer's counters; `live` gives whether a link is up and its open channels.
  void Snapshot(EngineMetrics *out, const std::map<uint64_t, int> &live_channels) const;

 private:
  static constexpr size_t kMaxPeers = 4096;  // beyond: peers no link holds are forgotten
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<PeerStats>> peers_;
  PeerStats none_{0};
};

}  // namespace metrics

// Engines of this process (ProcessMetrics), registered for their life.
class Impl;
void RegisterEngine(Impl *e);
void UnregisterEngine(Impl *e);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_METRICS_STATS_H_
