// SPDX-License-Identifier: Apache-2.0
// The engine's side of its metrics: where a link attempt's end is counted, and the snapshot (a
// transfer's end: Executor::Tally).
#include "common/util.h"
#include "engine/engine.h"
#include "metrics/stats.h"
#include "transport/registry.h"

namespace kvblocks {

Status Impl::TallyLink(uint64_t cluster_id, Status st) {
  if (st != LLM_SUCCESS && st != LLM_ALREADY_LINK) metrics::Add(stats_.Peer(cluster_id)->link_failures);
  return st;
}

void Impl::Metrics(EngineMetrics *out) {
  out->cluster_id = cluster_id_;
  caches_.Visit([out](const std::map<int64_t, std::shared_ptr<CacheEntry>> &all) {
    for (const auto &kv : all) {
      ++out->caches;
      out->cache_bytes += kv.second->tensor_bytes * kv.second->num_tensors;
    }
  });
  std::map<uint64_t, int> live;
  for (const auto &link : links_.Alive()) {
    RequestChannels *channels = ServedChannels(*link);
    const int requester = channels != nullptr ? channels->count() : 0;
    std::lock_guard<std::mutex> g(link->mu);
    live[link->remote_cluster_id] = requester + link->reverse_channels + link->served_channels;
  }
  stats_.Snapshot(out, live);
}

}  // namespace kvblocks
