// SPDX-License-Identifier: Apache-2.0
// The handshake every connection starts with: HELLO, CHALLENGE, AUTH, HELLO_ACK, with mutual
// HMAC proofs when a token is set (docs/protocol.md). Nothing but these is exchanged before both
// sides are authenticated.
#ifndef KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_
#define KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_

#include <functional>
#include <string>

#include "llm_datadist/llm_datadist.h"
#include "wire/messages.h"

namespace kvblocks {

// Opener side, up to HELLO_ACK: LLM_SUCCESS once both sides are authenticated (or why not).
// `server_nonce` gets the CHALLENGE nonce (for the in-process proof). `*dropped` is set when the
// listener closed the connection before HELLO_ACK: a listener under a connect flood drops its oldest
// unauthenticated connections, and the caller may try again with a fresh one (OpenHandshake).
llm_datadist::Status ClientHandshake(int fd, const Hello &hello, const std::string &token, int64_t deadline,
                                     uint8_t server_nonce[kNonceBytes], bool *dropped);
// Acceptor side, up to and including HELLO_ACK(0). False when the connection must be dropped; the
// peer has then been answered where the protocol says so. Reads at most a few hundred bytes.
// `authenticated` runs once the peer's proof checked out, before HELLO_ACK: it takes the connection
// out of the pre-authentication slots, so it cannot be dropped after the peer was told it is in;
// false (it was dropped already) ends the handshake.
bool ServerHandshake(int fd, const std::string &token, int64_t deadline, Hello *hello,
                     uint8_t server_nonce[kNonceBytes], const std::function<bool()> &authenticated);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_
