// SPDX-License-Identifier: Apache-2.0
#include "link/handshake.h"

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include <atomic>
#include <cstring>
#include "net/socket.h"
#include "security/auth.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {
// Receives one frame of `type` and decodes it into `m`; one longer than its type may be
// (kPayloadLimits) is refused from its header.
template <typename M>
IoResult RecvMessage(int fd, uint16_t type, int64_t deadline, M *m, FrameHeader *seen = nullptr) {
  FrameHeader local;
  FrameHeader &h = seen != nullptr ? *seen : local;
  std::string payload;
  IoResult r = RecvHeader(fd, &h, deadline);
  if (r == IoResult::kOk && h.type != type) r = IoResult::kError;
  if (r == IoResult::kOk) r = RecvPayload(fd, h, Channel::kHandshake, &payload, deadline);
  return r == IoResult::kOk && !Decode(payload, m) ? IoResult::kError : r;
}

void Mac(const uint8_t *key, size_t key_len, const char *label, const Transcript &t, uint8_t out[kProofBytes]) {
  std::string bytes;
  Encode(t, &bytes);
  Proof(key, key_len, label, bytes, out);
}

void TokenProof(const std::string &token, const char *label, const Transcript &t, uint8_t out[kProofBytes]) {
  Mac(reinterpret_cast<const uint8_t *>(token.data()), token.size(), label, t, out);
}

// Everything but the address, as both sides know it from the HELLO and the CHALLENGE.
void FillTranscript(const Hello &hello, uint64_t listener_cluster_id, const uint8_t *server_nonce, Transcript *t) {
  *t = Transcript();
  t->kind = hello.kind;
  t->opener_cluster_id = hello.cluster_id;
  t->listener_cluster_id = listener_cluster_id;
  memcpy(t->client_nonce, hello.nonce, kNonceBytes);
  memcpy(t->server_nonce, server_nonce, kNonceBytes);
}
// A HELLO of another protocol version: an operator upgrading one side sees why links fail. Once a
// second at most (anyone can send one).
void LogVersionMismatch(const Hello &hello) {
  static std::atomic<int64_t> last{0};
  const int64_t now = NowNs();
  int64_t before = last.load();
  if (now - before < 1000000000LL || !last.compare_exchange_strong(before, now)) return;
  LogWarn("rejected a link from cluster %llu: it speaks kvblocks protocol version %u, this engine %u",
          static_cast<unsigned long long>(hello.cluster_id), hello.version, kProtocolVersion);
}
}  // namespace

Bind BindFor(const uint8_t link_token[16], const Transcript &t) {
  Bind b;
  Mac(link_token, 16, kBindLabel, t, b.mac);
  return b;
}

Status ClientHandshake(int fd, const Hello &hello, uint64_t listener_cluster_id, const std::string &token,
                       int64_t deadline, Transcript *t, bool *dropped) {
  *dropped = false;
  IoResult r = SendMessage(fd, kHello, 0, hello, deadline);
  *dropped = r == IoResult::kClosed;
  if (r != IoResult::kOk) return Fail(StatusOf(r), "handshake: sending HELLO failed");
  Challenge ch;
  FrameHeader seen{};
  r = RecvMessage(fd, kChallenge, deadline, &ch, &seen);
  *dropped = r == IoResult::kClosed;
  if (r != IoResult::kOk && seen.type == kError && seen.status == LLM_PARAM_INVALID) {
    // What a listener answers a HELLO it cannot decode: in practice one of another protocol version.
    NoteLinkReason(LinkFailureReason::kVersionMismatch);
    return Fail(LLM_LINK_FAILED, "the listener refused our HELLO (kvblocks protocol version %u): it runs another "
                "kvblocks version", kProtocolVersion);
  }
  if (r != IoResult::kOk) {
    const bool late = NowNs() >= deadline;
    NoteLinkReason(late ? LinkFailureReason::kTimedOut : LinkFailureReason::kOther);
    return Fail(late ? LLM_TIMEOUT : LLM_LINK_FAILED, "handshake: %s", late
                ? "the listener accepted the connection but sent no CHALLENGE before the link timeout (is it "
                  "stopped, overloaded, or not kvblocks?)"
                : "no valid CHALLENGE from the listener (it closed the connection, or is not kvblocks)");
  }
  FillTranscript(hello, listener_cluster_id, ch.nonce, t);
  // With a token the proofs also name the address we dialled: a proof relayed to another listener
  // (or through a proxy) does not check out there. Without one nothing is authenticated anyway.
  if (!token.empty() && !ListenerEndpoint(fd, true, &t->listener))
    return Fail(LLM_LINK_FAILED, "handshake: the listener's address is unknown");
  // Always answer the challenge first, so a listener with a different token sees and logs it. The
  // proof is all we send before the listener has proven itself: identity, tables and link tokens
  // follow only after HELLO_ACK, and only to a listener whose proof checked out.
  AuthProof auth;
  if (!token.empty()) {
    auth.has_proof = true;
    TokenProof(token, kOpenerLabel, *t, auth.proof);
  }
  r = SendMessage(fd, kAuth, 0, auth, deadline);
  *dropped = r == IoResult::kClosed;
  if (r != IoResult::kOk) return Fail(StatusOf(r), "handshake: sending AUTH failed");
  bool server_ok = true;
  if (!token.empty()) {
    uint8_t expect[kProofBytes];
    TokenProof(token, kListenerLabel, *t, expect);
    server_ok = ch.has_proof && ConstantTimeEqual(expect, ch.proof, kProofBytes);
  }
  if ((token.empty() && ch.auth_required) || !server_ok) NoteLinkReason(LinkFailureReason::kAuthRefused);
  if (token.empty() && ch.auth_required) {
    return Fail(LLM_LINK_FAILED, "the listener requires kvblocks.AuthToken and none is set");
  }
  if (!server_ok) {
    return Fail(LLM_LINK_FAILED, "the listener did not prove knowledge of kvblocks.AuthToken as cluster %llu at the "
                "address dialled (another token, another cluster, or a relay)",
                static_cast<unsigned long long>(listener_cluster_id));
  }
  FrameHeader h;
  std::string ack;
  r = RecvHeader(fd, &h, deadline);
  *dropped = r == IoResult::kClosed;
  if (r != IoResult::kOk) return Fail(StatusOf(r), "handshake: no HELLO_ACK from the listener");
  if (h.type != kHelloAck || RecvPayload(fd, h, Channel::kHandshake, &ack, deadline) != IoResult::kOk)
    return Fail(LLM_LINK_FAILED, "handshake: malformed HELLO_ACK");
  if (h.status == LLM_LINK_FAILED) NoteLinkReason(LinkFailureReason::kAuthRefused);
  if (h.status == LLM_LINK_FAILED && !token.empty())
    return Fail(LLM_LINK_FAILED, "the listener rejected our kvblocks.AuthToken proof");
  if (h.status != LLM_SUCCESS) return Fail(h.status, "handshake: the listener refused (status %u)", h.status);
  return LLM_SUCCESS;
}

bool ServerHandshake(int fd, const std::string &token, uint64_t cluster_id, int64_t deadline, Hello *hello,
                     Transcript *t, const std::function<bool()> &authenticated) {
  // The HELLO is fixed-size: a longer announcement is refused before anything is allocated.
  hello->version = kProtocolVersion;
  if (RecvMessage(fd, kHello, deadline, hello) != IoResult::kOk) {
    if (hello->version != kProtocolVersion) LogVersionMismatch(*hello);
    SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + kErrorReplyNs);
    return false;
  }
  Challenge ch;
  RandomBytes(ch.nonce, sizeof(ch.nonce));
  FillTranscript(*hello, cluster_id, ch.nonce, t);
  // Our own cluster id and our own end of this socket: a proof the opener made for another
  // listener names another cluster or another address.
  if (!token.empty() && !ListenerEndpoint(fd, false, &t->listener)) return false;
  ch.auth_required = !token.empty();
  if (!token.empty()) {
    ch.has_proof = true;
    TokenProof(token, kListenerLabel, *t, ch.proof);
  }
  AuthProof auth;
  if (SendMessage(fd, kChallenge, 0, ch, deadline) != IoResult::kOk ||
      RecvMessage(fd, kAuth, deadline, &auth) != IoResult::kOk)
    return false;
  if (!token.empty()) {
    uint8_t expect[kProofBytes];
    TokenProof(token, kOpenerLabel, *t, expect);
    if (!auth.has_proof || !ConstantTimeEqual(expect, auth.proof, kProofBytes)) {
      // "wrong": another token, or a proof made for another connection, cluster or address (a relay).
      LogWarn("rejected a link from cluster %llu: %s", static_cast<unsigned long long>(hello->cluster_id),
              auth.has_proof ? "wrong kvblocks.AuthToken proof (another token, or made for another listener)"
                             : "missing kvblocks.AuthToken");
      SendFrame(fd, kHelloAck, LLM_LINK_FAILED, nullptr, 0, deadline);
      return false;
    }
  }
  return authenticated() && SendFrame(fd, kHelloAck, LLM_SUCCESS, nullptr, 0, deadline) == IoResult::kOk;
}

}  // namespace kvblocks
