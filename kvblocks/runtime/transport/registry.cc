// SPDX-License-Identifier: Apache-2.0
#include "transport/registry.h"

#include <set>

#include "transport/peer.h"
#include "transport/select.h"
#include "wire/messages.h"

namespace kvblocks {

// One line per backend, most preferred first; each is defined in transport/<name>/.
#define KVBLOCKS_BACKENDS(X)                                                       \
  X(InProcess) /* transport/inprocess/: memcpy between two engines of this process */ \
  X(Shm)       /* transport/shm/: memcpy into a same-host peer's memfd, mapped here */ \
  X(Cma)       /* transport/cma/: process_vm_readv/writev on a same-host peer */   \
  X(Ucx)       /* transport/ucx/: UCP get/put, plugin loaded on first need */      \
  X(Tcp)       /* transport/tcp/: requests the peer serves; every peer offers it */

#define KVBLOCKS_DECLARE_BACKEND(n) Backend *n##Backend();
KVBLOCKS_BACKENDS(KVBLOCKS_DECLARE_BACKEND)
#undef KVBLOCKS_DECLARE_BACKEND

const std::vector<Backend *> &Backends() {
#define KVBLOCKS_LIST_BACKEND(n) n##Backend(),
  static const std::vector<Backend *> all = {KVBLOCKS_BACKENDS(KVBLOCKS_LIST_BACKEND)};
#undef KVBLOCKS_LIST_BACKEND
  return all;
}

Backend *FindBackend(const std::string &name) {
  for (Backend *b : Backends())
    if (name == b->name()) return b;
  return nullptr;
}

uint64_t OfferedCapabilities(const BackendOptions &o) {
  uint64_t caps = kCapCacheQuery | kCapKeyQuery | kCapCrc32c;  // not paths: every engine offers them
  for (Backend *b : Backends())
    if (b->Offered(o)) caps |= b->capability();
  return caps;
}

bool KnownTransport(const std::string &value) {
  if (value == "auto") return true;
  for (Backend *b : Backends())
    if (value == b->transport_option()) return true;
  return false;
}

std::string TransportChoices() {
  std::set<std::string> names;  // sorted, each once (the same-host backends share theirs)
  for (Backend *b : Backends()) names.insert(b->transport_option());
  std::string out = "auto";
  size_t left = names.size();
  for (const std::string &n : names) out += (--left == 0 ? " or " : ", ") + n;
  return out;
}

llm_datadist::Status CheckBackendOptions(const BackendOptions &o) {
  for (Backend *b : Backends()) {
    const llm_datadist::Status st = b->CheckOptions(o);
    if (st != llm_datadist::LLM_SUCCESS) return st;
  }
  return llm_datadist::LLM_SUCCESS;
}

uint64_t LocalExchangeCapabilities() {
  uint64_t caps = 0;
  for (Backend *b : Backends())
    if (b->NeedsLocalExchange()) caps |= b->capability();
  return caps;
}

bool TransportSuits(const PeerLink &link, const std::string &transport, std::string *names) {
  bool selects = false;
  for (Backend *b : Backends()) {
    if (transport != b->transport_option() || b->ExchangesAttachData()) continue;
    for (const Attached &a : link.attached)
      if (a.backend == b) return true;
    if (b->Suits(link)) return true;
    selects = true;
    *names += (names->empty() ? "" : ", ") + std::string(b->name());
  }
  return !selects;
}

std::vector<Backend *> AttachExchangers(uint64_t caps) {
  std::vector<Backend *> out;
  for (Backend *b : Backends())
    if (b->ExchangesAttachData() && (caps & b->capability()) != 0) out.push_back(b);
  return out;
}

uint8_t BackendId(const Backend &b) { return static_cast<uint8_t>(__builtin_ctzll(b.capability())); }

void ChoosePaths(PeerLink *link) {
  VerifyPeer(link);
  link->attached.clear();
  Backend *served = Backends().back();
  for (Backend *b : Backends()) {
    std::shared_ptr<PeerState> state;
    if ((link->capabilities & b->capability()) != 0 && b->Attach(link, &state))
      link->attached.push_back(Attached{b, std::move(state)});
  }
  // Every peer is served, whatever it offered.
  if (link->attached.empty() || link->attached.back().backend != served) {
    std::shared_ptr<PeerState> state;
    served->Attach(link, &state);
    link->attached.push_back(Attached{served, std::move(state)});
  }
  // Host memory on our side: the only kind a cache is registered with today.
  for (auto &kv : link->caches) {
    RemoteCache &rc = kv.second;
    rc.path = SelectPath(link->attached, link->capabilities, MemKind::kHost, rc.mem.kind, link, rc);
    if (!rc.path) rc.path = ServedPath(link, rc);
  }
  link->local.Release();  // memfds of caches no backend mapped
}

void AttachLater(PeerLink *link, Backend *b, std::shared_ptr<PeerState> state, bool all) {
  const std::vector<Attached> one = {Attached{b, state}};
  for (auto &kv : link->caches) {
    RemoteCache &rc = kv.second;
    if (!all && rc.path && rc.path->mode() != PathMode::kServed) continue;
    std::shared_ptr<Path> p = SelectPath(one, link->capabilities, MemKind::kHost, rc.mem.kind, link, rc);
    if (p) rc.path = std::move(p);
  }
  // Before the served fallback, so the description and the preference order agree.
  auto it = link->attached.begin();
  while (it != link->attached.end() && it->backend->path_mode() != PathMode::kServed) ++it;
  link->attached.insert(it, Attached{b, std::move(state)});
}

namespace {
PeerState *ServedState(const PeerLink &link) {
  Backend *served = Backends().back();
  for (const Attached &a : link.attached)
    if (a.backend == served) return a.state.get();
  return nullptr;
}
}  // namespace

RequestChannels *ServedChannels(const PeerLink &link) { return dynamic_cast<RequestChannels *>(ServedState(link)); }

std::shared_ptr<Path> ServedPath(PeerLink *link, RemoteCache &rc) {
  Backend *served = Backends().back();
  std::shared_ptr<Path> p = served->PathFor(link, ServedState(*link), rc);
  if (p) p->owner = served;
  return p;
}

std::string DescribePaths(const PeerLink &link) {
  std::string out;
  for (const Attached &a : link.attached) {
    if (a.backend->path_mode() == PathMode::kServed) continue;
    bool used = false;
    for (const auto &kv : link.caches) used = used || (kv.second.path && kv.second.path->owner == a.backend);
    if (used) out += (out.empty() ? "" : "+") + std::string(a.backend->name());
  }
  if (out.empty() && !link.attached.empty()) out = link.attached.front().backend->name();
  return out;
}

bool OneSidedPeer(const PeerLink &link) {
  if (link.same_host) return true;
  for (const Attached &a : link.attached)
    if (a.backend->path_mode() != PathMode::kServed) return true;
  return false;
}

void UnregisterEverywhere(LocalMemory *cache) {
  for (Backend *b : Backends()) b->Unregister(cache);
}

void DescribeEverywhere(const LocalMemory &cache, TableEntry *entry) {
  for (Backend *b : Backends()) b->Describe(cache, entry);
}

}  // namespace kvblocks
