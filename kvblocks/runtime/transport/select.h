// SPDX-License-Identifier: Apache-2.0
// Which path reaches each of a peer's caches: decided once per link from the capabilities both
// sides offer and from what this process can verify about the peer.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_

#include <cstdint>
#include <string>

#include "wire/messages.h"

namespace kvblocks {

struct Link;

// Capabilities this engine offers under kvblocks.Transport (auto | shm | tcp).
uint64_t OfferedCapabilities(const std::string &transport);
// This process's identity for the handshake; `instance` and `probe` belong to the engine.
void FillIdentity(uint64_t instance, const uint64_t *probe, PeerIdentity *id);
// Engines of this process, so a same-process peer is recognised.
void RegisterInstance(uint64_t instance);
void UnregisterInstance(uint64_t instance);
// Sets link->same_host/same_process/one_sided and a Path on every remote cache.
void ChoosePaths(Link *link, const PeerIdentity &me);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_
