// SPDX-License-Identifier: Apache-2.0
// Mutual authentication of links: HMAC-SHA256 challenge-response over the handshake transcript
// (fresh nonces, connection kind, both cluster ids, the listener's address), so a proof is good for
// one connection only. The token itself never crosses the wire.
#ifndef KVBLOCKS_RUNTIME_SECURITY_AUTH_H_
#define KVBLOCKS_RUNTIME_SECURITY_AUTH_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvblocks {

constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 32;
// One label per direction and purpose, so no proof can be reflected or reused as another.
constexpr char kOpenerLabel[] = "kvblocks-v5-opener";      // AUTH: the opener knows the token
constexpr char kListenerLabel[] = "kvblocks-v5-listener";  // CHALLENGE: the listener knows it
constexpr char kBindLabel[] = "kvblocks-v5-bind";          // BIND: the opener holds the link token

void HmacSha256(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t msg_len, uint8_t out[32]);
bool ConstantTimeEqual(const uint8_t *a, const uint8_t *b, size_t n);
// HMAC-SHA256(key, len u8 || label || transcript): `transcript` is an encoded Transcript
// (wire/messages.h), fixed-size, so label and transcript can never be shifted into each other.
void Proof(const uint8_t *key, size_t key_len, const char *label, const std::string &transcript, uint8_t out[32]);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_SECURITY_AUTH_H_
