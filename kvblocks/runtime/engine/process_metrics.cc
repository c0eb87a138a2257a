// SPDX-License-Identifier: Apache-2.0
// The engines of this process, and the JSON form of their snapshots.
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <set>

#include "engine/engine.h"
#include "metrics/stats.h"

namespace kvblocks {

namespace {
// Held while an engine is snapshotted, so its destructor (UnregisterEngine first) waits for it.
std::mutex &EnginesMu() {
  static std::mutex mu;
  return mu;
}
std::set<Impl *> &Engines() {
  static std::set<Impl *> e;
  return e;
}

void Num(std::string *s, const char *key, uint64_t v, bool comma = true) {
  char b[64];
  snprintf(b, sizeof(b), "\"%s\":%" PRIu64 "%s", key, v, comma ? "," : "");
  *s += b;
}

void Str(std::string *s, const char *key, const std::string &v) {
  *s += "\"";
  *s += key;
  *s += "\":\"";
  *s += v;  // our own names: no character needs escaping
  *s += "\",";
}

void Double(std::string *s, const char *key, double v) {
  char b[64];
  snprintf(b, sizeof(b), "\"%s\":%.9g,", key, v);
  *s += b;
}

template <typename T, typename Fn>
void List(std::string *s, const char *key, const std::vector<T> &v, Fn &&each) {
  *s += "\"";
  *s += key;
  *s += "\":[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) *s += ",";
    each(v[i]);
  }
  *s += "]";
}

void KindJson(std::string *s, const KindMetrics &k) {
  *s += "{";
  Str(s, "kind", k.kind);
  Num(s, "count", k.count);
  Num(s, "bytes", k.bytes);
  Double(s, "seconds_sum", k.seconds_sum);
  *s += "\"status\":{";
  bool first = true;
  for (const auto &kv : k.status) {
    if (!first) *s += ",";
    first = false;
    Num(s, kv.first.c_str(), kv.second, false);
  }
  *s += "},";
  List(s, "buckets", k.buckets, [s](uint64_t n) { *s += std::to_string(n); });
  *s += "}";
}

void PathJson(std::string *s, const PathMetrics &p) {
  *s += "{";
  Str(s, "path", p.path);
  *s += "\"in_flight\":" + std::to_string(p.in_flight) + ",";
  Num(s, "bytes_in", p.bytes_in);
  Num(s, "bytes_out", p.bytes_out);
  List(s, "kinds", p.kinds, [s](const KindMetrics &k) { KindJson(s, k); });
  *s += "}";
}

void PeerJson(std::string *s, const PeerMetrics &p) {
  *s += "{";
  if (p.unlinked_peer) *s += "\"peer\":null,";
  else Num(s, "peer", p.cluster_id);
  *s += p.linked ? "\"linked\":true," : "\"linked\":false,";
  Num(s, "data_channels", static_cast<uint64_t>(p.data_channels));
  Num(s, "links", p.links);
  Num(s, "relinks", p.relinks);
  Num(s, "unlinks", p.unlinks);
  Num(s, "link_failures", p.link_failures);
  Num(s, "link_breaks", p.link_breaks);
  Num(s, "notifies_sent", p.notifies_sent);
  Num(s, "notifies_received", p.notifies_received);
  Num(s, "timeouts", p.timeouts);
  Num(s, "crc_mismatches", p.crc_mismatches);
  List(s, "paths", p.paths, [s](const PathMetrics &x) { PathJson(s, x); });
  *s += "}";
}

void EngineJson(std::string *s, const EngineMetrics &e) {
  *s += "{";
  Num(s, "version", static_cast<uint64_t>(e.version));
  Num(s, "cluster_id", e.cluster_id);
  Num(s, "caches", e.caches);
  Num(s, "cache_bytes", e.cache_bytes);
  List(s, "bucket_bounds", e.bucket_bounds, [s](double b) {
    char t[32];
    snprintf(t, sizeof(t), "%.9g", b);
    *s += t;
  });
  *s += ",";
  List(s, "peers", e.peers, [s](const PeerMetrics &p) { PeerJson(s, p); });
  *s += "}";
}
}  // namespace

void RegisterEngine(Impl *e) {
  std::lock_guard<std::mutex> g(EnginesMu());
  Engines().insert(e);
}

void UnregisterEngine(Impl *e) {
  std::lock_guard<std::mutex> g(EnginesMu());
  Engines().erase(e);
}

std::vector<EngineMetrics> ProcessMetrics() noexcept {
  std::vector<EngineMetrics> out;
  try {
    std::lock_guard<std::mutex> g(EnginesMu());
    for (Impl *e : Engines()) {
      if (!e->Live()) continue;  // finalized (or not started): its counters are history
      out.emplace_back();
      e->Metrics(&out.back());
    }
  } catch (...) {
    out.clear();
  }
  return out;
}

std::string MetricsJson(const std::vector<EngineMetrics> &engines) noexcept {
  try {
    std::string s = "[";
    for (size_t i = 0; i < engines.size(); ++i) {
      if (i) s += ",";
      EngineJson(&s, engines[i]);
    }
    return s + "]";
  } catch (...) {
    return "[]";
  }
}

}  // namespace kvblocks
