// SPDX-License-Identifier: Apache-2.0
// Runtime metrics of kvblocks engines: a plain, versioned snapshot (README "Metrics").
// Counters only grow for the life of an engine; a peer's counters survive unlink and relink.
// ABI: std::string inside, so (as NotifyMessage in ext_types.h) the structs carry [abi:cxx11]: a
// client built with another _GLIBCXX_USE_CXX11_ABI fails to link rather than misread them.
#ifndef KVBLOCKS_METRICS_H_
#define KVBLOCKS_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvblocks/ext_types.h"  // KVBLOCKS_STD_STRING_ABI
#include "llm_datadist/llm_datadist.h"  // KVBLOCKS_API

namespace kvblocks {

// Bumped when a field changes meaning or goes away (new fields do not bump it).
constexpr int kMetricsVersion = 1;

// Transfers of one kind ("pull_blocks", "push_blocks", "pull_cache", "push_cache",
// "pull_blocks_async", "push_blocks_async", "push_layerwise", "hixl_read", "hixl_write",
// "hixl_read_async", "hixl_write_async") on one path to one peer.
struct KVBLOCKS_STD_STRING_ABI KindMetrics {
  std::string kind;
  uint64_t count = 0;                       // finished, any status
  std::map<std::string, uint64_t> status;   // "success", "timeout", "kv_cache_not_exist", ... -> count
  uint64_t bytes = 0;                       // moved by the successful ones
  double seconds_sum = 0;                   // latency sum, from the call (or submission) to the end
  std::vector<uint64_t> buckets;            // per bucket (not cumulative); the last one is +Inf
};

struct KVBLOCKS_STD_STRING_ABI PathMetrics {
  std::string path;  // the Path's name: "inprocess", "shm", "cma", "tcp", "ucx"; "none": failed before a path
  int64_t in_flight = 0;  // transfers moving bytes on this path now
  uint64_t bytes_in = 0;   // pulled / read into this engine
  uint64_t bytes_out = 0;  // pushed / written from this engine
  std::vector<KindMetrics> kinds;  // only kinds with a transfer
};

struct KVBLOCKS_STD_STRING_ABI PeerMetrics {
  uint64_t cluster_id = 0;
  bool unlinked_peer = false;  // the bucket of transfers that never found a link (cluster_id 0)
  bool linked = false;         // a live link exists now
  int data_channels = 0;       // open now
  uint64_t links = 0, relinks = 0, unlinks = 0, link_failures = 0, link_breaks = 0;
  uint64_t notifies_sent = 0, notifies_received = 0;
  uint64_t crc_mismatches = 0;  // kvblocks.Integrity=crc32c: transfers that failed their check, this side
  uint64_t timeouts = 0;  // transfers that ended LLM_TIMEOUT, all kinds and paths
  std::vector<PathMetrics> paths;
};

struct KVBLOCKS_STD_STRING_ABI EngineMetrics {
  int version = kMetricsVersion;
  uint64_t cluster_id = 0;
  uint64_t caches = 0, cache_bytes = 0;  // registered or allocated now
  std::vector<double> bucket_bounds;     // upper bounds (seconds) of KindMetrics::buckets, +Inf left out
  std::vector<PeerMetrics> peers;
};

// Every live (initialized, not finalized) engine of this process, then the same as JSON (one object
// per engine, the fields above).
KVBLOCKS_API std::vector<EngineMetrics> ProcessMetrics() noexcept;
KVBLOCKS_API std::string MetricsJson(const std::vector<EngineMetrics> &engines) noexcept;
inline std::string ProcessMetricsJson() noexcept { return MetricsJson(ProcessMetrics()); }

}  // namespace kvblocks

#endif  // KVBLOCKS_METRICS_H_
