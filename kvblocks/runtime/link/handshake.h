// SPDX-License-Identifier: Apache-2.0
// The handshake every connection starts with: HELLO, CHALLENGE, AUTH, HELLO_ACK, with mutual
// HMAC proofs when a token is set (docs/protocol.md). Nothing but these is exchanged before both
// sides are authenticated.
#ifndef KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_
#define KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_

#include <functional>
#include <functional>
#include <string>

#include "llm_datadist/llm_datadist.h"
#include "wire/messages.h"

namespace kvblocks {

// Opener side, up to HELLO_ACK: LLM_SUCCESS once both sides are authenticated (or why not).
// `listener_cluster_id` is the cluster the opener means to reach; `t` gets this connection's
// transcript (the BIND and the in-process proof use it). `*dropped` is set when the listener closed
// the connection before HELLO_ACK: a listener under a connect flood drops its oldest
// unauthenticated connections, and the caller may try again with a fresh one (OpenHandshake).
llm_datadist::Status ClientHandshake(int fd, const Hello &hello, uint64_t listener_cluster_id, const std::string &token,
                                     int64_t deadline, Transcript *t, bool *dropped);
// Acceptor side, up to and including HELLO_ACK(0). False when the connection must be dropped; the
// peer has then been answered where the protocol says so. Reads at most a few hundred bytes.
// `cluster_id` is this listener's own. `authenticated` runs once the peer's proof checked out,
// before HELLO_ACK: it takes the connection out of the pre-authentication slots, so it cannot be
// dropped after the peer was told it is in; false (it was dropped already) ends the handshake.
bool ServerHandshake(int fd, const std::string &token, uint64_t cluster_id, int64_t deadline, Hello *hello,
                     Transcript *t, const std::function<bool()> &authenticated);
// A data channel's BIND for the link whose data-channel token is `link_token`, on the connection
// whose transcript is `t`.
Bind BindFor(const uint8_t link_token[16], const Transcript &t);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_HANDSHAKE_H_
