// SPDX-License-Identifier: Apache-2.0
// LinkLlmClusters / UnlinkLlmClusters (and hixl's connect / disconnect): the argument checks in
// CANN's order, then the linker (link/linker.h) per cluster; and what the linker asks of the engine.
#include <arpa/inet.h>

#include "common/error.h"
#include "engine/engine.h"
#include "transport/path.h"

namespace kvblocks {

namespace {
bool ValidIpv4(const IpInfo &ip) {
  in_addr a;
  return ip.ip.GetLength() != 0 && inet_pton(AF_INET, ip.ip.GetString(), &a) == 1;
}

// Link and Unlink share the argument checks (CANN order: timeout, addresses, empty list) and the
// result rule: one status per cluster, the call returning the last failure.
template <typename Fn>
Status EachCluster(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms,
                   bool check_local, Fn &&one) {
  if (timeout_ms <= 0) return Fail(LLM_PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  for (size_t i = 0; i < clusters.size(); ++i) {
    for (const auto &ip : clusters[i].remote_ip_infos)
      if (!ValidIpv4(ip))
        return Fail(LLM_PARAM_INVALID, "clusters[%zu].remote_ip_infos: \"%s\" is not an IPv4 address", i,
                    ip.ip.GetString());
    if (check_local)
      for (const auto &ip : clusters[i].local_ip_infos)
        if (!ValidIpv4(ip))
          return Fail(LLM_PARAM_INVALID, "clusters[%zu].local_ip_infos: \"%s\" is not an IPv4 address", i,
                      ip.ip.GetString());
  }
  if (clusters.empty()) return Fail(LLM_PARAM_INVALID, "no clusters given");
  rets.assign(clusters.size(), LLM_SUCCESS);
  Status overall = LLM_SUCCESS;
  for (size_t i = 0; i < clusters.size(); ++i) {
    rets[i] = one(clusters[i]);
    if (rets[i] != LLM_SUCCESS) overall = rets[i];
  }
  return overall;
}
}  // namespace

Status Impl::Link(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "link_llm_clusters: the engine is not initialized");
  return EachCluster(clusters, rets, timeout_ms, true,
                     [&](const ClusterInfo &c) { return TallyLink(c.remote_cluster_id, linker_.LinkOne(c, timeout_ms)); });
}

Status Impl::Unlink(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms,
                    bool force) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "unlink_llm_clusters: the engine is not initialized");
  return EachCluster(clusters, rets, timeout_ms, false,
                     [&](const ClusterInfo &c) { return linker_.UnlinkOne(c, timeout_ms, force); });
}

// hixl's connect/disconnect: a peer named by its address, IPv4 or IPv6, with no local_ip_infos.
Status Impl::LinkAddress(uint64_t remote_cluster_id, const std::string &ip, uint16_t port, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  if (timeout_ms <= 0) return Fail(LLM_PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  ClusterInfo ci;
  ci.remote_cluster_id = remote_cluster_id;
  IpInfo remote;
  remote.ip = AscendString(ip.c_str());
  remote.port = port;
  ci.remote_ip_infos.push_back(remote);
  ci.local_ip_infos.push_back(IpInfo());
  return TallyLink(remote_cluster_id, linker_.LinkOne(ci, timeout_ms));
}

Status Impl::UnlinkCluster(uint64_t remote_cluster_id, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  ClusterInfo ci;
  ci.remote_cluster_id = remote_cluster_id;
  ci.remote_ip_infos.push_back(IpInfo());
  return linker_.UnlinkOne(ci, timeout_ms, false);
}

// ------------------------------------------------------------------ LinkerHost: what the linker asks of us
std::vector<TableEntry> Impl::DescribeCaches() { return caches_.Describe(); }

void Impl::AddMemfds(const std::vector<TableEntry> &shown, LocalFds *out, std::vector<std::shared_ptr<void>> *keep) {
  for (const TableEntry &t : shown) {
    if (!t.has_memfd || out->size() >= kMaxLocalFds) continue;
    auto e = caches_.Find(t.id);
    if (!e || !e->region) continue;
    keep->push_back(e);
    out->emplace_back(t.id, e->region->fd);
  }
}

std::shared_ptr<LocalMemory> Impl::OurCache(int64_t id) { return caches_.Find(id); }

void Impl::Serve(int fd, const std::shared_ptr<struct Link> &link) { ServeChannel(fd, link.get(), caches_); }

bool Impl::Running() const { return initialized(); }

}  // namespace kvblocks
