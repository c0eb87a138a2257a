// SPDX-License-Identifier: Apache-2.0
#include "transport/select.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

#include "link/link.h"
#include "transport/path.h"

namespace kvblocks {

namespace {
std::mutex g_instances_mu;
std::set<uint64_t> g_instances;  // live engine tokens of this process

bool IsLocalInstance(uint64_t token) {
  std::lock_guard<std::mutex> g(g_instances_mu);
  return g_instances.count(token) != 0;
}

void ReadBootId(uint8_t out[16]) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  size_t k = 0;
  for (size_t i = 0; i + 1 < s.size() && k < 16;) {
    if (s[i] == '-') {
      ++i;
      continue;
    }
    unsigned v;
    if (sscanf(s.c_str() + i, "%2x", &v) != 1) break;
    out[k++] = static_cast<uint8_t>(v);
    i += 2;
  }
}

// Cross-memory attach needs ptrace permission on the peer; probe it on a known cookie.
bool CanAttach(const PeerIdentity &peer) {
  uint64_t got = 0;
  iovec l{&got, sizeof(got)};
  iovec r{reinterpret_cast<void *>(peer.probe_addr), sizeof(got)};
  return process_vm_readv(static_cast<pid_t>(peer.pid), &l, 1, &r, 1, 0) == sizeof(got) && got == peer.probe_value;
}

std::shared_ptr<Path> PathFor(Link *link, const RemoteCache &rc, bool cma_ok) {
  const uint64_t caps = link->capabilities;
  if (rc.has_memfd && (caps & kCapSharedMemory)) {
    const MemfdDesc &m = rc.memfd;
    auto mapped = SharedRegion::MapPeer(static_cast<int>(link->peer.pid), m.fd, m.ino, m.dev, m.region_size);
    if (mapped) {
      std::vector<uint8_t *> view;
      for (uint32_t i = 0; i < rc.num_tensors; ++i) view.push_back(mapped->base + i * m.pitch);
      return MakeMemoryPath("shm", std::move(view), std::move(mapped));
    }
  }
  if (link->same_process && (caps & kCapInProcess) && !rc.addrs.empty()) {
    std::vector<uint8_t *> view;
    for (uint64_t a : rc.addrs) view.push_back(reinterpret_cast<uint8_t *>(a));
    return MakeMemoryPath("inprocess", std::move(view), nullptr);
  }
  if (cma_ok && (caps & kCapCma) && !rc.addrs.empty()) return MakeCmaPath(static_cast<int>(link->peer.pid), rc.addrs);
  return MakeTcpPath(link, rc.id);
}

}  // namespace

uint64_t OfferedCapabilities(const std::string &transport) {
  if (transport == "tcp") return kCapTcp;
  return kCapTcp | kCapSharedMemory | kCapCma | kCapInProcess;
}

void FillIdentity(uint64_t instance, const uint64_t *probe, PeerIdentity *id) {
  ReadBootId(id->boot_id);
  struct stat st;
  id->netns = stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  id->pid = static_cast<uint32_t>(getpid());
  id->instance = instance;
  id->probe_addr = reinterpret_cast<uint64_t>(probe);
  id->probe_value = *probe;
}

void RegisterInstance(uint64_t instance) {
  std::lock_guard<std::mutex> g(g_instances_mu);
  g_instances.insert(instance);
}

void UnregisterInstance(uint64_t instance) {
  std::lock_guard<std::mutex> g(g_instances_mu);
  g_instances.erase(instance);
}

void ChoosePaths(Link *link, const PeerIdentity &me) {
  const bool same_boot = memcmp(me.boot_id, link->peer.boot_id, 16) == 0;
  link->same_host = same_boot && me.netns == link->peer.netns && me.netns != 0;
  link->same_process = link->same_host && link->peer.pid == me.pid && IsLocalInstance(link->peer.instance);
  const bool one_sided = link->same_host && (link->capabilities & ~uint64_t{kCapTcp}) != 0;
  const bool cma_ok = one_sided && (link->same_process || CanAttach(link->peer));
  link->one_sided = one_sided;
  for (auto &kv : link->caches)
    kv.second.path = one_sided ? PathFor(link, kv.second, cma_ok) : MakeTcpPath(link, kv.second.id);
}

}  // namespace kvblocks
