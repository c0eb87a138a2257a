// SPDX-License-Identifier: Apache-2.0
// Every wire message: one struct, one encoder and one decoder, used by both sides. Decoders reject
// anything short, long or inconsistent; docs/protocol.md describes the layout.
#ifndef KVBLOCKS_RUNTIME_WIRE_MESSAGES_H_
#define KVBLOCKS_RUNTIME_WIRE_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "wire/table.h"
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
  kBind = 7,      // data channel, after authentication: the link token; answered with kBind + status
  kLinkInfo = 8,  // control, after authentication: each side's LinkInfoMsg (the answer carries a status)
  kUnlink = 10,
  kUnlinkAck = 11,
  kOpenReverse = 12,
  kCacheGone = 13,     // unregistered: stop using it one-sided
  kCacheGoneAck = 14,
  kReverseRefused = 15,  // the opener will not open the requested reverse channel
  kNotify = 16,          // control: a user notification (Notify), answered with kNotifyAck
  kNotifyAck = 17,       // control: Notify with the same seq and the receiver's status, no text
  kKeyConsumed = 18,     // control: the sender pulled by a key of the receiver's cache, consuming it (KeyRef)
  kKeyReleased = 19,     // control: a key of the sender's cache is no longer bound (KeyRef)
  kCacheQuery = 25,      // control: describe one of your caches (CacheQuery), answered with kCacheInfo
  kCacheInfo = 26,       // control: the answer (CacheInfo): that cache's table entry, or none
  kBackendAttach = 27,   // handshake, after CONFIRM: BackendAttach, each way, per backend both offered that exchanges
  kReadReq = 20,
  kReadResp = 21,
  kWriteReq = 22,
  kWriteReady = 23,
  kWriteDone = 24,
  kError = 30,
};
constexpr uint16_t kFlagInline = 1;    // WRITE_REQ: the data follows the request
constexpr uint16_t kFlagCrossing = 2;  // LINK_INFO/CONFIRM_ACK refusal: both sides link at once, ours wins
constexpr uint16_t kFlagCrc32c = 4;    // READ_REQ/WRITE_REQ to a kCapCrc32c peer: the data carries CRC blocks

constexpr size_t kFrameHeaderBytes = 24;
struct FrameHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t status = 0;
  uint64_t length = 0;  // payload bytes that follow
};
void EncodeHeader(const FrameHeader &h, uint8_t out[kFrameHeaderBytes]);
bool DecodeHeader(const uint8_t in[kFrameHeaderBytes], FrameHeader *h);  // false: bad magic

// The data of a READ_RESP and of an inline WRITE_REQ starts kDataAlign bytes (or a multiple) into
// its frame: zeros pad what comes before it (`before` bytes: the header, and the request of a
// write). The kernel copies between socket buffers and user pages with `rep movsb`, which on some
// CPUs (AMD EPYC here) is much slower when the two are 8 bytes out of 16-byte alignment; a 16x4KiB
// pull took 63 us with the data right after the 24-byte header and 41 us 64 bytes in.
constexpr size_t kDataAlign = 64;
inline size_t DataPad(uint64_t before) { return static_cast<size_t>((kDataAlign - before % kDataAlign) % kDataAlign); }
extern const uint8_t kZeroPad[kDataAlign];

// Capabilities a side offers in its handshake; a path is used only when both offer it. Bits 0-3 and
// 7 are the path backends', each defined with its backend in transport/<name>/ (docs/protocol.md
// lists them); bit 4 is retired (descriptors in the cache table, shown to every linked peer) and
// never offered. The bits below are not paths: every engine offers them.
enum Capability : uint64_t {
  kCapCacheQuery = 1 << 5,    // answers CACHE_QUERY (a cache registered after linking)
  kCapKeyQuery = 1 << 6,      // answers CACHE_QUERY by cache key and by batch key too
  kCapCrc32c = 1 << 8,        // serves and checks data requests with kFlagCrc32c
};

enum class ConnKind : uint32_t { kCtrl = 1, kDataFwd = 2, kDataRev = 3 };

// What a side CLAIMS about itself. Only hints: same-process and same-host paths are chosen from
// facts this process verifies (an in-process proof, SO_PEERCRED on a local socket), never from these.
struct PeerIdentity {
  uint8_t boot_id[16] = {};
  uint64_t netns = 0;
  uint64_t instance = 0;
  uint64_t probe_addr = 0, probe_value = 0;
};

// What a control connection's side says about itself, sent only after mutual authentication.
struct LinkInfo {
  uint64_t capabilities = 0;
  PeerIdentity identity;
  int64_t clock_ns = 0;    // CLOCK_MONOTONIC when sent
  std::string local_name;  // acceptor: abstract Unix socket for the same-host exchange ("" = none)
  uint8_t local_key[16] = {};  // what the other side must present on that socket / must be answered with
  std::vector<TableEntry> caches;
};

// LINK_INFO payload. `inproc_proof` = HMAC(process secret, role || client nonce || server nonce ||
// every byte before it): only an engine of this very process can produce it for fresh nonces.
struct LinkInfoMsg {
  uint64_t cluster_id = 0;
  uint8_t link_token[16] = {};  // acceptor only: the key of data channels' BIND MACs
  LinkInfo info;
  uint8_t inproc_proof[kProofBytes] = {};
};

// Fixed size, so a listener reads at most kHelloBytes from an unauthenticated peer.
struct Hello {
  uint32_t version = kProtocolVersion;
  ConnKind kind = ConnKind::kCtrl;
  uint64_t cluster_id = 0;  // the opener's
  uint8_t nonce[kNonceBytes] = {};
};
constexpr size_t kHelloBytes = 32;

// The listener's address as this connection reached it: the opener's getpeername, the
// listener's getsockname (net/socket.h). IPv4, and IPv4-mapped IPv6, are family 4 with the address
// in ip[0..4); no scope id, which names an interface of one host only.
struct Endpoint {
  uint8_t family = 0;  // 4 or 6; 0 (all zero) without an AuthToken
  uint8_t ip[16] = {};
  uint16_t port = 0;
};

// What every proof of a connection covers (docs/protocol.md, "Handshake"). Never sent: each side
// fills it from what it sent, received and dialled or accepted, so a proof made for another
// connection, kind, cluster or listener does not check out. Encoded at a fixed size (75 bytes).
struct Transcript {
  ConnKind kind = ConnKind::kCtrl;
  uint64_t opener_cluster_id = 0;    // the HELLO's
  uint64_t listener_cluster_id = 0;  // the opener: the one it links to; the listener: its own
  uint8_t client_nonce[kNonceBytes] = {};
  uint8_t server_nonce[kNonceBytes] = {};
  Endpoint listener;
};

// A data channel's first message after authentication: HMAC(link token, kBindLabel || transcript
// of this connection), so it names one link, one listener and one connection, and the link token
// itself does not cross the wire again.
struct Bind {
  uint8_t mac[kProofBytes] = {};
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

struct Confirm {
  int64_t clock_offset_ns = 0;  // opener clock = acceptor clock + offset (the bound that errs early)
  bool local_exchange = false;  // the opener connects to the acceptor's local socket now
};

// BACKEND_ATTACH: one backend's attach data for this link (transport/backend.h AttachData), opaque
// here and decoded by that backend alone. Sent only after CONFIRM, only to this peer and only for a
// backend both sides offered: such data may reach the sender's memory without its serving it
// (README, threat model), so it never goes in LINK_INFO, which any authenticated peer reads.
struct BackendAttach {
  uint8_t backend = 0;  // the index of the backend's capability bit: the receiver checks it is the one it expects
  std::string data;     // at most kMaxLinkInfoPayload - 1 bytes (the frame's bound)
};

struct CacheRef {  // CACHE_GONE and CACHE_GONE_ACK
  int64_t cache_id = 0;
};

// What a CACHE_QUERY names. kQueryById is what every kCapCacheQuery peer answers; the key kinds
// only go to peers that offered kCapKeyQuery.
enum CacheQueryKind : uint8_t {
  kQueryById = 1,        // cache `cache_id`
  kQueryByCacheKey = 2,  // a cache tagged `key` (TableEntry::key; CANN's BlocksCacheKey)
  kQueryByBatchKey = 3,  // a cache with a batch bound to `key`, else one tagged `key` (CANN's CacheKey)
};

// CACHE_QUERY: describe cache `cache_id` (one the asker's link-time table lacks), or (a key kind)
// the cache that holds key `key`; `seq` is the asker's, echoed by the answer, so an answer matches
// exactly one query. A by-id query is encoded as (cache_id, seq) alone, as peers offering only
// kCapCacheQuery expect; a key query appends (kind u8, key i64) and carries cache_id 0.
struct CacheQuery {
  int64_t cache_id = 0;
  uint64_t seq = 0;
  CacheQueryKind kind = kQueryById;
  int64_t key = -1;  // key kinds only: >= 0
};

// CACHE_INFO: the answer to CACHE_QUERY: the cache's table entry (`found`), or none (not
// registered, or being unregistered). `cache_id` is the entry's id (a key query answered with none:
// 0); the asker matches the answer by `seq` and checks the entry holds what it asked. The entry is one link-time table entry, decoded with the same
// checks (DecodeTable); the decoder refuses anything but zero or one entry, and an entry of another id.
struct CacheInfo {
  int64_t cache_id = 0;
  uint64_t seq = 0;
  bool found = false;
  TableEntry entry;
};

// KEY_CONSUMED and KEY_RELEASED (spec hixl.md 3.4): key `key` bound to a batch of cache `cache_id`
// of the cache's owner (the receiver of KEY_CONSUMED, the sender of KEY_RELEASED).
struct KeyRef {
  int64_t cache_id = 0;
  int64_t key = -1;
};

// NOTIFY and NOTIFY_ACK: a user notification on the control connection. It follows every transfer
// the sender finished before it; the ack says whether the receiver queued it (status LLM_SUCCESS, or
// LLM_LINK_BUSY when its queue is full). Name and message are at most kMaxNotifyName and
// kMaxNotifyMessage bytes; the decoder refuses longer ones.
struct Notify {
  uint64_t seq = 0;     // the sender's, echoed by the ack
  uint32_t status = 0;  // ack only
  std::string name, message;
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

// ---- kvblocks.Integrity=crc32c (kFlagCrc32c): after every kCrcGroupPairs (tensor, range) pairs of
// a request's data stream (the last group: the rest) comes a CRC block: each pair's CRC32C, u32,
// zero-padded to a multiple of kDataAlign bytes (so the data after it keeps its alignment).
constexpr uint64_t kCrcGroupPairs = 1024;
inline uint64_t CrcBlockBytes(uint64_t pairs_in_group) { return 4 * pairs_in_group + DataPad(4 * pairs_in_group); }
// All CRC blocks of a stream of `pairs` pairs.
inline uint64_t CrcTrailerBytes(uint64_t pairs) {
  return pairs / kCrcGroupPairs * CrcBlockBytes(kCrcGroupPairs) + CrcBlockBytes(pairs % kCrcGroupPairs);
}

// WRITE_DONE's payload when a kFlagCrc32c write's bytes did not match their CRC (status LLM_FAILED):
// the first pair (in stream order, counted from 0) that differed.
struct CrcMismatch {
  uint64_t pair = 0;
};
constexpr size_t kCrcMismatchBytes = 8;

// ---- payload bounds
// Where a frame arrives: the handshake of any connection (before it belongs to a link), a link's
// control connection, or a data channel this side serves.
enum class Channel : uint8_t { kHandshake, kControl, kData };

// The largest payload each frame type may announce, per channel; checked from the header before
// anything is allocated (net/socket.cc RecvPayload), and buffers then grow only with the bytes that
// arrive. kSmallPayload bounds the fixed-size messages (each is at most 50 bytes) and every type not
// listed for a channel (those without payload, and unknown ones, which are skipped or answered
// with ERROR).
constexpr uint64_t kSmallPayload = 64;
constexpr uint64_t kMaxNotifyPayload = 20 + kMaxNotifyName + kMaxNotifyMessage;
struct PayloadLimit {
  uint16_t type;
  Channel channel;
  uint64_t max;
};
constexpr PayloadLimit kPayloadLimits[] = {
    {kHello, Channel::kHandshake, kHelloBytes},
    {kChallenge, Channel::kHandshake, kSmallPayload},
    {kAuth, Channel::kHandshake, kSmallPayload},
    {kLinkInfo, Channel::kHandshake, kMaxLinkInfoPayload},
    {kConfirm, Channel::kHandshake, kSmallPayload},
    {kBind, Channel::kHandshake, sizeof(Bind::mac)},
    {kBackendAttach, Channel::kHandshake, kMaxLinkInfoPayload},  // descriptors of the link-time caches
    {kCacheGone, Channel::kControl, kSmallPayload},
    {kCacheGoneAck, Channel::kControl, kSmallPayload},
    {kNotify, Channel::kControl, kMaxNotifyPayload},
    {kNotifyAck, Channel::kControl, kMaxNotifyPayload},
    {kKeyConsumed, Channel::kControl, kSmallPayload},
    {kKeyReleased, Channel::kControl, kSmallPayload},
    {kCacheQuery, Channel::kControl, kSmallPayload},
    {kCacheInfo, Channel::kControl, kMaxCacheInfoPayload},
    {kReadReq, Channel::kData, kMaxRequestPayload},
    {kWriteReq, Channel::kData, kMaxRequestPayload},
};
constexpr uint64_t MaxPayload(uint16_t type, Channel ch) {
  for (const PayloadLimit &l : kPayloadLimits)
    if (l.type == type && l.channel == ch) return l.max;
  return kSmallPayload;
}

void Encode(const Hello &m, std::string *out);
void Encode(const Challenge &m, std::string *out);
void Encode(const AuthProof &m, std::string *out);
void Encode(const LinkInfoMsg &m, std::string *out);
void Encode(const Bind &m, std::string *out);
void Encode(const Transcript &m, std::string *out);  // only ever hashed: no decoder
void Encode(const Confirm &m, std::string *out);
void Encode(const CacheRef &m, std::string *out);
void Encode(const XferRequest &m, std::string *out);
void Encode(const Notify &m, std::string *out);
void Encode(const KeyRef &m, std::string *out);
void Encode(const CacheQuery &m, std::string *out);
void Encode(const CacheInfo &m, std::string *out);
void Encode(const BackendAttach &m, std::string *out);
void Encode(const CrcMismatch &m, std::string *out);

bool Decode(const std::string &in, Hello *m);  // false also for another protocol version
bool Decode(const std::string &in, Challenge *m);
bool Decode(const std::string &in, AuthProof *m);
bool Decode(const std::string &in, LinkInfoMsg *m);
bool Decode(const std::string &in, Bind *m);
bool Decode(const std::string &in, Confirm *m);
bool Decode(const std::string &in, CacheRef *m);
bool Decode(const std::string &in, XferRequest *m);
bool Decode(const std::string &in, Notify *m);
bool Decode(const std::string &in, KeyRef *m);  // false also for a negative key
bool Decode(const std::string &in, CacheQuery *m);  // false also for a bad kind or key
bool Decode(const std::string &in, CacheInfo *m);
bool Decode(const std::string &in, BackendAttach *m);  // false for an empty payload
bool Decode(const std::string &in, CrcMismatch *m);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_WIRE_MESSAGES_H_
