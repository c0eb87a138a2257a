// SPDX-License-Identifier: Apache-2.0
// Every wire message: one struct, one encoder and one decoder, used by both sides. Decoders reject
// anything short, long or inconsistent; docs/protocol.md describes the layout.
#ifndef KVBLOCKS_RUNTIME_WIRE_MESSAGES_H_
#define KVBLOCKS_RUNTIME_WIRE_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cache/table.h"
#include "common/limits.h"
#include "security/auth.h"

namespace kvblocks {

enum FrameType : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  kHelloAck = 4,
  kConfirm = 5,
  kConfirmAck = 6,
  kUnlink = 10,
  kUnlinkAck = 11,
  kOpenReverse = 12,
  kCacheGone = 13,     // unregistered: stop using it one-sided
  kCacheGoneAck = 14,
  kReadReq = 20,
  kReadResp = 21,
  kWriteReq = 22,
  kWriteReady = 23,
  kWriteDone = 24,
  kError = 30,
};
constexpr uint16_t kFlagInline = 1;  // WRITE_REQ: the data follows the request

constexpr size_t kFrameHeaderBytes = 24;
struct FrameHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t status = 0;
  uint64_t length = 0;  // payload bytes that follow
};
void EncodeHeader(const FrameHeader &h, uint8_t out[kFrameHeaderBytes]);
bool DecodeHeader(const uint8_t in[kFrameHeaderBytes], FrameHeader *h);  // false: bad magic

// Capabilities a side offers in its handshake; a path is used only when both offer it.
enum Capability : uint64_t {
  kCapTcp = 1 << 0,
  kCapSharedMemory = 1 << 1,  // map the peer's memfd
  kCapCma = 1 << 2,           // process_vm_readv/writev on registered memory
  kCapInProcess = 1 << 3,     // plain memcpy between two engines of one process
};

enum class ConnKind : uint32_t { kCtrl = 1, kDataFwd = 2, kDataRev = 3 };

struct PeerIdentity {
  uint8_t boot_id[16] = {};
  uint64_t netns = 0;
  uint32_t pid = 0;
  uint64_t instance = 0;
  uint64_t probe_addr = 0, probe_value = 0;
};

// What a control connection's side says about itself: capabilities, identity, clock, caches.
struct LinkInfo {
  uint64_t capabilities = 0;
  PeerIdentity identity;
  int64_t clock_ns = 0;  // CLOCK_MONOTONIC when sent
  std::vector<TableEntry> caches;
};

struct Hello {
  uint32_t version = kProtocolVersion;
  ConnKind kind = ConnKind::kCtrl;
  uint64_t cluster_id = 0;  // the opener's
  uint8_t nonce[kNonceBytes] = {};
  uint8_t link_token[16] = {};  // zeros on control connections
  LinkInfo info;                // control connections only
};

struct Challenge {
  uint8_t nonce[kNonceBytes] = {};
  bool auth_required = false;
  bool has_proof = false;
  uint8_t proof[kProofBytes] = {};
};

struct AuthProof {
  bool has_proof = false;
  uint8_t proof[kProofBytes] = {};
};

// The acceptor's answer on a control connection with status 0 (data channels: empty payload).
struct HelloAck {
  uint64_t cluster_id = 0;
  uint8_t link_token[16] = {};
  LinkInfo info;
};

struct Confirm {
  int64_t clock_offset_ns = 0;  // acceptor clock = opener clock + offset
};

struct CacheRef {  // CACHE_GONE and CACHE_GONE_ACK
  int64_t cache_id = 0;
};

struct ByteRange {
  uint64_t offset = 0, length = 0;
};

// READ_REQ / WRITE_REQ: the same ranges of every listed tensor of the server's cache.
struct XferRequest {
  int64_t cache_id = 0;
  int64_t deadline = 0;  // the requester's deadline in the server's clock
  int64_t budget = 0;    // ns left before it when sent: immune to clock drift
  uint64_t total = 0;    // tensors x sum of range lengths
  std::vector<uint32_t> tensors;
  std::vector<ByteRange> ranges;
};

void Encode(const Hello &m, std::string *out);
void Encode(const Challenge &m, std::string *out);
void Encode(const AuthProof &m, std::string *out);
void Encode(const HelloAck &m, std::string *out);
void Encode(const Confirm &m, std::string *out);
void Encode(const CacheRef &m, std::string *out);
void Encode(const XferRequest &m, std::string *out);

bool Decode(const std::string &in, Hello *m);  // false also for another protocol version
bool Decode(const std::string &in, Challenge *m);
bool Decode(const std::string &in, AuthProof *m);
bool Decode(const std::string &in, HelloAck *m);
bool Decode(const std::string &in, Confirm *m);
bool Decode(const std::string &in, CacheRef *m);
bool Decode(const std::string &in, XferRequest *m);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_WIRE_MESSAGES_H_
