// SPDX-License-Identifier: Apache-2.0
// The handshake every connection starts with: HELLO, CHALLENGE, AUTH, HELLO_ACK, with mutual
// HMAC proofs when a token is set (docs/protocol.md).
#ifndef KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_
#define KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_

#include <string>

#include "llm_datadist/llm_datadist.h"
#include "wire/messages.h"

namespace kvblocks {

// Opener side. Returns HELLO_ACK's status (or why the exchange failed); `ack` gets its payload.
llm_datadist::Status ClientHandshake(int fd, const Hello &hello, const std::string &token, int64_t deadline,
                                     std::string *ack);
// Acceptor side, up to the proof check. False when the connection must be dropped; the peer has
// then been answered where the protocol says so.
bool ServerHandshake(int fd, const std::string &token, int64_t deadline, Hello *hello);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_
