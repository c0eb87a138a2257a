// SPDX-License-Identifier: Apache-2.0
// The engine's side of its metrics: where a transfer's end is counted, and the snapshot.
#include "common/util.h"
#include "engine/engine.h"
#include "engine/transfer.h"
#include "metrics/stats.h"
#include "transport/registry.h"

namespace kvblocks {

namespace {
uint64_t PlanBytes(const Transfer *t) {
  uint64_t n = t->plan.total_bytes();
  for (const auto &p : t->rest) n += p->plan.total_bytes();
  return n;
}
}  // namespace

// The peer is the link's (none: the call failed before it found one); the path is the remote
// cache's, so a new transport needs nothing here.
Status Impl::Tally(const Transfer *t, Status st) {
  metrics::PeerStats &peer = t->link ? *t->link->stats : stats_.none();
  const char *path = t->remote != nullptr ? t->remote->path->name() : "none";
  peer.Finish(path, t->kind, st, st == LLM_SUCCESS ? PlanBytes(t) : 0, NowNs() - t->start_ns);
  return st;
}

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
