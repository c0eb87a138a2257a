// SPDX-License-Identifier: Apache-2.0
#include "transport/select.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

#include "common/error.h"
#include "common/util.h"
#include "security/auth.h"
#include "transport/beacon.h"
#include "transport/local_peer.h"
#include "transport/path.h"
#include "transport/peer.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

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

// Checks the peer is still there before and after every one-sided copy: a copy through a dead
// peer's mapping never reports success. With `pidfd` (for a path that addresses the peer by pid: a pid
// can be reused) each check polls the pidfd. A shared-memory copy reads the peer's beacon instead
// (transport/beacon.h: a word the kernel marks when the peer dies, as synchronous as the pidfd),
// which saves two system calls (about 1.2 us here) per small copy; a peer that sent no beacon is
// polled as with `pidfd`. An engine of this process is looked up among this process's instances.
class GuardedPath : public Path {
 public:
  GuardedPath(std::shared_ptr<Path> inner, PeerLink *link, bool pidfd)
      : inner_(std::move(inner)), link_(link), pidfd_(pidfd) {}
  const char *name() const override { return inner_->name(); }
  PathMode mode() const override { return inner_->mode(); }
  Status Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) override {
    if (!PeerAlive(link_, pidfd_)) {
      link_->Fail();
      return Fail(LLM_NOT_YET_LINK, "cluster %llu has gone (its process exited or its engine finalized)",
                  static_cast<unsigned long long>(link_->remote_cluster_id));
    }
    const Status st = inner_->Execute(plan, local, pull, deadline);
    if (st == LLM_SUCCESS && !PeerAlive(link_, pidfd_)) {
      link_->Fail();
      return Fail(LLM_LINK_FAILED, "cluster %llu went away during the transfer",
                  static_cast<unsigned long long>(link_->remote_cluster_id));
    }
    return st;
  }

 private:
  std::shared_ptr<Path> inner_;
  PeerLink *link_;  // owns this path
  bool pidfd_;
};

uint8_t g_secret[32];
void NewSecret() { RandomBytes(g_secret, sizeof(g_secret)); }

// Per process, and a forked child gets a fresh one (at once, while it has a single thread): a child
// that kept its parent's secret would pass for it, and its engines would never try the same-host
// exchange with the parent's.
const uint8_t *ProcessSecret() {
  static std::once_flag once;
  std::call_once(once, [] {
    NewSecret();
    pthread_atfork(nullptr, nullptr, NewSecret);
  });
  return g_secret;
}

void ProcessProof(uint8_t role, const uint8_t *client_nonce, const uint8_t *server_nonce, const std::string &payload,
                    uint8_t out[kProofBytes]) {
  std::string msg;
  msg.push_back(static_cast<char>(role));
  msg.append(reinterpret_cast<const char *>(client_nonce), kNonceBytes);
  msg.append(reinterpret_cast<const char *>(server_nonce), kNonceBytes);
  msg.append(payload, 0, payload.size() - kProofBytes);
  HmacSha256(ProcessSecret(), 32, reinterpret_cast<const uint8_t *>(msg.data()), msg.size(), out);
}

}  // namespace

void SealLinkInfo(uint8_t role, const uint8_t *client_nonce, const uint8_t *server_nonce, std::string *payload) {
  uint8_t proof[kProofBytes];
  ProcessProof(role, client_nonce, server_nonce, *payload, proof);
  memcpy(&(*payload)[payload->size() - kProofBytes], proof, kProofBytes);
}

bool FromThisProcess(uint8_t role, const uint8_t *client_nonce, const uint8_t *server_nonce,
                     const std::string &payload) {
  if (payload.size() < kProofBytes) return false;
  uint8_t expect[kProofBytes];
  ProcessProof(role, client_nonce, server_nonce, payload, expect);
  return ConstantTimeEqual(expect, reinterpret_cast<const uint8_t *>(payload.data()) + payload.size() - kProofBytes,
                           kProofBytes);
}

bool SameHostHint(const PeerIdentity &me, const PeerIdentity &peer) {
  return memcmp(me.boot_id, peer.boot_id, 16) == 0 && me.netns == peer.netns && me.netns != 0;
}

bool PeerAlive(const PeerLink *link, bool pidfd) {
  if (!link->alive.load()) return false;
  if (link->same_process) return IsLocalInstance(link->peer.instance);
  if (!pidfd && link->local.beacon) return link->local.beacon->Alive();
  return !ProcessExited(link->local.pidfd);
}

void FillIdentity(uint64_t instance, const uint64_t *probe, PeerIdentity *id) {
  ReadBootId(id->boot_id);
  struct stat st;
  id->netns = stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
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

void VerifyPeer(PeerLink *link) {
  // Only verified facts: the in-process proof (same_process, set by the caller) or a kernel-verified
  // pid from the local exchange. What the peer says about its identity plays no part.
  if (link->same_process && !IsLocalInstance(link->peer.instance)) link->same_process = false;
  link->same_host = link->same_process || link->local.pid > 0;
  link->local.TakeBeacon();
}

std::shared_ptr<Path> Guarded(std::shared_ptr<Path> p, PeerLink *link, bool pidfd) {
  return std::make_shared<GuardedPath>(std::move(p), link, pidfd);
}

}  // namespace kvblocks
