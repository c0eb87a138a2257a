// SPDX-License-Identifier: Apache-2.0
// What this process can verify about a peer (its identity, the in-process proof, its liveness);
// the backends attach from these facts (transport/registry.h).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "transport/path.h"
#include "wire/messages.h"

namespace kvblocks {

struct PeerLink;

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
// Settles link->same_process (the proof, and the engine still here) and link->same_host (that, or
// the local exchange's kernel-verified pid) before any backend attaches; maps the peer's beacon.
void VerifyPeer(PeerLink *link);
// The link is up and the peer still exists: its engine in this process; its process by its beacon
// (without `pidfd`, when it sent one) or by polling its pidfd.
bool PeerAlive(const PeerLink *link, bool pidfd);
// `p`, checking the peer is alive before and after every copy (for paths that never involve it).
std::shared_ptr<Path> Guarded(std::shared_ptr<Path> p, PeerLink *link, bool pidfd);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_SELECT_H_
