// SPDX-License-Identifier: Apache-2.0
// The backends in order of preference, and the choice of a path per remote cache: the first backend
// that both sides offered, that attached to the peer from verified facts, that serves both memory
// kinds and that reaches the cache. The last one (served: the peer runs the requests) every peer offers.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_REGISTRY_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/backend.h"
#include "transport/peer.h"

namespace kvblocks {

// Every backend of this build, most preferred first.
const std::vector<Backend *> &Backends();
// The backend named `name`, null when none is.
Backend *FindBackend(const std::string &name);

// The path to `rc` (of memory kind `remote`) from the first of `attached`, in their order, whose
// capability is in `caps`, that serves (local, remote) and that gives one; null when none does.
inline std::shared_ptr<Path> SelectPath(const std::vector<Attached> &attached, uint64_t caps, MemKind local,
                                        MemKind remote, PeerLink *link, RemoteCache &rc) {
  for (const Attached &a : attached) {
    if ((caps & a.backend->capability()) == 0 || !a.backend->Serves(local, remote)) continue;
    std::shared_ptr<Path> p = a.backend->PathFor(link, a.state.get(), rc);
    if (!p) continue;
    p->owner = a.backend;
    return p;
  }
  return nullptr;
}

// The capabilities this engine offers: every offered backend's bit and the non-path ones.
uint64_t OfferedCapabilities(const BackendOptions &o);
// Whether `value` is a kvblocks.Transport value: auto, or some backend's transport_option().
bool KnownTransport(const std::string &value);
// The values KnownTransport accepts, for an error message (auto, then the others sorted).
std::string TransportChoices();
// Every backend's CheckOptions, in order of preference: the first refusal, else LLM_SUCCESS.
llm_datadist::Status CheckBackendOptions(const BackendOptions &o);
// The capabilities whose backends need the same-host local exchange.
uint64_t LocalExchangeCapabilities();
// kvblocks.Transport=`transport` and the backends it selects attach at link time: false when none of
// them Suits the link, with their names in *names ("a, b").
bool TransportSuits(const PeerLink &link, const std::string &transport, std::string *names);
// The backends that exchange attach data after CONFIRM (ExchangesAttachData), in order of
// preference; those in `caps` only when `caps` is given.
std::vector<Backend *> AttachExchangers(uint64_t caps = ~uint64_t{0});
// A backend's id in BACKEND_ATTACH: the index of its capability bit.
uint8_t BackendId(const Backend &b);
// Attaches every backend both sides offered to the link (from link->same_process, the verified
// in-process proof, and link->local, the kernel-verified local exchange) and gives each remote
// cache its path. Backends that attach later (after CONFIRM) call AttachLater.
void ChoosePaths(PeerLink *link);
// `b` attached to the link after ChoosePaths with `state`: it takes every cache still on a served
// path (every cache when `all`) that it reaches.
void AttachLater(PeerLink *link, Backend *b, std::shared_ptr<PeerState> state, bool all);
// The served backend's channel pool on the link; null only before ChoosePaths.
RequestChannels *ServedChannels(const PeerLink &link);
// The served path (the last backend's) to a cache learned after linking.
std::shared_ptr<Path> ServedPath(PeerLink *link, RemoteCache &rc);
// The link's paths for link_path and the logs: the backends that reach some cache one-sidedly,
// joined by '+' in order of preference; with none, the most preferred backend attached.
std::string DescribePaths(const PeerLink &link);
// Some backend lets the peer reach our memory without our serving it (one-sided).
bool OneSidedPeer(const PeerLink &link);
// Forget `cache` in every backend (it is unregistered and peers stopped using it).
void UnregisterEverywhere(LocalMemory *cache);
// Every backend's descriptor of `cache` in `entry`.
void DescribeEverywhere(const LocalMemory &cache, TableEntry *entry);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_REGISTRY_H_
