// SPDX-License-Identifier: Apache-2.0
// Mutual authentication of links: HMAC-SHA256 challenge-response over fresh nonces. The token
// itself never crosses the wire.
#ifndef KVBLOCKS_RUNTIME_SECURITY_AUTH_H_
#define KVBLOCKS_RUNTIME_SECURITY_AUTH_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvblocks {

constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 32;
constexpr char kClientLabel[] = "kvblocks-client";
constexpr char kServerLabel[] = "kvblocks-server";

void HmacSha256(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t msg_len, uint8_t out[32]);
bool ConstantTimeEqual(const uint8_t *a, const uint8_t *b, size_t n);
// HMAC-SHA256(token, label || client_nonce || server_nonce): what each side proves.
void Proof(const std::string &token, const char *label, const uint8_t *client_nonce, const uint8_t *server_nonce,
           uint8_t out[32]);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_SECURITY_AUTH_H_
