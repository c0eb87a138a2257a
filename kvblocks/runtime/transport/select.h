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

// Capabilities this engine offers under kvblocks.Transport (auto | shm | tcp | ucx); UCX only with
// kvblocks.UcxTrustedNetwork=1 (`ucx_trusted`).
uint64_t OfferedCapabilities(const std::string &transport, bool ucx_trusted);
// This process's identity for the handshake; `instance` and `probe` belong to the engine.
void FillIdentity(uint64_t instance, const uint64_t *probe, PeerIdentity *id);
// Engines of this process, so a same-process peer is recognised.
void RegisterInstance(uint64_t instance);
void UnregisterInstance(uint64_t instance);
// The in-process proof of a LINK_INFO payload (role 'O' opener, 'A' acceptor): SealLinkInfo writes
// it into the payload's last kProofBytes; FromThisProcess is true only when an engine of this very
// process wrote that payload for these nonces.
void SealLinkInfo(uint8_t role, const uint8_t *client_nonce, const uint8_t *server_nonce, std::string *payload);
bool FromThisProcess(uint8_t role, const uint8_t *client_nonce, const uint8_t *server_nonce,
                     const std::string &payload);
// The peer's claimed boot id and network namespace match ours: worth trying the local exchange.
bool SameHostHint(const PeerIdentity &me, const PeerIdentity &peer);
// Sets link->same_host/one_sided and a Path on every remote cache from link->same_process (the
// verified in-process proof) and link->local (the kernel-verified local exchange).
void ChoosePaths(Link *link);
// The link is up and the peer still exists: its engine in this process; its process by its beacon
// (without `pidfd`, when it sent one) or by polling its pidfd.
bool PeerAlive(const Link *link, bool pidfd);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_
