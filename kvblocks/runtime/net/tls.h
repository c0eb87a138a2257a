// SPDX-License-Identifier: Apache-2.0
// kvblocks.Encryption=tls: TLS 1.3 on every connection of a link (control and data), through the
// system's OpenSSL 3 loaded with dlopen() on first use, so neither the build nor `import kvblocks`
// depends on it. Keyed by kvblocks.AuthToken as an external PSK (psk_dhe_ke: an ephemeral ECDHE
// share on top, for forward secrecy), or by certificates (mutual, one private CA) where given.
//
// TLS runs first on a connection; the kvblocks handshake follows inside it, its proofs keyed by the
// token bound to this TLS session (exporter), so a relay cannot splice two sessions (protocol.md).
// Once a session is started on an fd, net/socket.cc moves that fd's bytes through it: every caller
// keeps calling SendIov/RecvIov/RecvBuffer with its deadline, plain or encrypted alike.
#ifndef KVBLOCKS_RUNTIME_NET_TLS_H_
#define KVBLOCKS_RUNTIME_NET_TLS_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct TlsConfig {
  std::string token;              // kvblocks.AuthToken: the PSK is derived from it
  std::string cert, key, ca;      // kvblocks.TlsCertFile / TlsKeyFile / TlsCaFile: certificate mode
};

class TlsContext;  // one per engine: an SSL_CTX and the PSK

// The context for `cfg`; nullptr with *why when libssl cannot be loaded or the files are unusable.
std::shared_ptr<TlsContext> MakeTlsContext(const TlsConfig &cfg, std::string *why);

// TLS handshake on the connected non-blocking socket `fd` (the opener is the client), by `deadline`.
// On success the session belongs to `fd` until CloseConn(fd). `peer` names the far end in messages.
// `*dropped` (when given) is set when the peer closed the connection mid-handshake without a word:
// the caller may try again, as after a kvblocks handshake dropped by a listener under a flood.
llm_datadist::Status TlsStart(TlsContext *ctx, int fd, bool client, int64_t deadline, const std::string &peer,
                              bool *dropped = nullptr);

// The key of the kvblocks handshake proofs on `fd`: the token itself on a plain connection; on a TLS
// one, HMAC(token, label || TLS exporter), so a proof is good inside this TLS session only.
std::string ProofKey(int fd, const std::string &token);

// Closes `fd`, ending its TLS session first when it has one. Every connection that may carry TLS
// is closed through here.
void CloseConn(int fd);

// ---- for net/socket.cc only
struct TlsConn;
constexpr size_t kTlsReadAheadBytes = 4 * 16384 + 1024;  // OpenSSL's read buffer: raw bytes it may hold
TlsConn *TlsOf(int fd);  // nullptr: a plain socket (one atomic load when no engine uses TLS)
// True when the kernel does this direction's TLS (kTLS): the plain sendmsg/recvmsg path then applies.
bool TlsKernel(const TlsConn *c, bool send);
// Non-blocking, as recv/sendmsg with MSG_DONTWAIT: > 0 bytes moved; 0 the peer closed (reads);
// -1 with errno, EAGAIN meaning wait for *events (POLLIN or POLLOUT) and call again. A write that
// returned EAGAIN must be called again with the same bytes first (they stay at the front of `iov`).
ssize_t TlsRecv(TlsConn *c, void *p, size_t n, short *events);
ssize_t TlsSendv(TlsConn *c, const struct iovec *iov, size_t iovcnt, short *events);
bool TlsBuffered(TlsConn *c);  // decrypted or raw bytes already read from the socket

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_NET_TLS_H_
