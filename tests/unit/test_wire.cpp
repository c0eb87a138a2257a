// SPDX-License-Identifier: Apache-2.0
// Wire messages (kvblocks/runtime/wire/, and the backends' own, transport/<name>/): every message round-trips through its one encoder and one
// decoder; every strict prefix, and random corruption, is refused or decodes to a message that
// re-encodes stably, never a crash or an allocation the bytes did not pay for.
#include <cstring>
#include <string>
#include <vector>

#include "unit.h"
#include "wire/codec.h"
#include "wire/messages.h"
#include "transport/ucx/ucx_info.h"

using namespace kvblocks;  // NOLINT: test code
using unit::Rand;

namespace {

void Fill(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(Rand(256));
}
std::string Text(size_t max) {
  std::string s(Rand(max + 1), '\0');
  for (char &c : s) c = static_cast<char>('a' + Rand(26));
  return s;
}

TableEntry RandomEntry(int64_t id) {
  TableEntry c;
  c.id = id;
  c.kind = static_cast<CacheKind>(Rand(3));
  c.key = Rand(2) ? -1 : static_cast<int64_t>(Rand(1000));
  c.num_tensors = 1 + static_cast<uint32_t>(Rand(8));
  c.stride = 1 + Rand(1 << 16);
  c.num_blocks = Rand(64);
  c.batch_size = Rand(4);
  c.tensor_bytes = c.stride * (std::max(c.num_blocks, c.batch_size) + Rand(3)) + 1;
  if (Rand(2)) {
    c.has_memfd = true;
    c.memfd.fd = static_cast<int32_t>(Rand(100));
    c.memfd.ino = Rand(0);
    c.memfd.dev = Rand(0);
    c.memfd.pitch = c.tensor_bytes + Rand(4096);
    c.memfd.region_size = c.memfd.pitch * c.num_tensors;
  }
  if (Rand(2)) {
    c.addrs.resize(c.num_tensors);
    for (uint64_t &a : c.addrs) a = Rand(0);
  }
  c.batch_keys.resize(Rand(c.batch_size + 1));
  for (int64_t &k : c.batch_keys) k = static_cast<int64_t>(Rand(100)) - 1;
  return c;
}

void Random(Hello *m) {
  m->kind = static_cast<ConnKind>(1 + Rand(3));
  m->cluster_id = Rand(0);
  Fill(m->nonce, sizeof(m->nonce));
}
void Random(Challenge *m) {
  Fill(m->nonce, sizeof(m->nonce));
  m->auth_required = Rand(2);
  m->has_proof = Rand(2);
  Fill(m->proof, sizeof(m->proof));
}
void Random(AuthProof *m) {
  m->has_proof = Rand(2);
  Fill(m->proof, sizeof(m->proof));
}
void Random(LinkInfoMsg *m) {
  m->cluster_id = Rand(0);
  Fill(m->link_token, sizeof(m->link_token));
  m->info.capabilities = Rand(256);
  Fill(m->info.identity.boot_id, sizeof(m->info.identity.boot_id));
  m->info.identity.netns = Rand(0);
  m->info.identity.instance = Rand(0);
  m->info.identity.probe_addr = Rand(0);
  m->info.identity.probe_value = Rand(0);
  m->info.clock_ns = static_cast<int64_t>(Rand(1ULL << 62));
  m->info.local_name = Text(kMaxLocalName);
  Fill(m->info.local_key, sizeof(m->info.local_key));
  for (int i = 0, n = static_cast<int>(Rand(5)); i < n; ++i) m->info.caches.push_back(RandomEntry(i + 1));
  Fill(m->inproc_proof, sizeof(m->inproc_proof));
}
void Random(Bind *m) { Fill(m->mac, sizeof(m->mac)); }
void Random(Confirm *m) {
  m->clock_offset_ns = static_cast<int64_t>(Rand(0));
  m->local_exchange = Rand(2);
}
void Random(CacheRef *m) { m->cache_id = static_cast<int64_t>(Rand(1 << 20)); }
void Random(CrcMismatch *m) { m->pair = Rand(0); }
void Random(XferRequest *m) {
  m->cache_id = static_cast<int64_t>(Rand(1 << 20));
  m->deadline = static_cast<int64_t>(Rand(1ULL << 62));
  m->budget = static_cast<int64_t>(Rand(1ULL << 40));
  m->tensors.resize(Rand(20));
  for (uint32_t &t : m->tensors) t = static_cast<uint32_t>(Rand(1000));
  m->ranges.resize(Rand(20));
  for (ByteRange &g : m->ranges) g = ByteRange{Rand(1ULL << 40), Rand(1 << 20)};
  m->total = Rand(0);
}
void Random(Notify *m) {
  m->seq = Rand(0);
  m->status = static_cast<uint32_t>(Rand(0));
  m->name = Text(64);
  m->message = Text(kMaxNotifyMessage);
}
void Random(KeyRef *m) {
  m->cache_id = static_cast<int64_t>(Rand(1 << 20));
  m->key = static_cast<int64_t>(Rand(1 << 20));
}
void Random(CacheQuery *m) {
  m->seq = Rand(0);
  m->kind = static_cast<CacheQueryKind>(1 + Rand(3));
  m->key = m->kind == kQueryById ? -1 : static_cast<int64_t>(Rand(1 << 20));
  m->cache_id = m->kind == kQueryById ? static_cast<int64_t>(Rand(1 << 20)) : 0;  // by key: no id
}
void Random(CacheInfo *m) {
  m->cache_id = 1 + static_cast<int64_t>(Rand(1 << 20));
  m->seq = Rand(0);
  m->found = Rand(2);
  if (m->found) m->entry = RandomEntry(m->cache_id);
}
void Random(BackendAttach *m) {
  m->backend = static_cast<uint8_t>(Rand(64));
  m->data = Text(300);
}
void Random(UcxInfo *m) {
  m->worker = Text(200);
  if (m->worker.empty()) return;  // no worker, no caches
  for (int i = 0, n = static_cast<int>(Rand(4)); i < n; ++i) {
    UcxCacheKeys k;
    k.cache_id = i + 1;
    for (int j = 0, nk = 1 + static_cast<int>(Rand(3)); j < nk; ++j) k.rkeys.push_back("k" + Text(40));
    for (int t = 0, nt = 1 + static_cast<int>(Rand(6)); t < nt; ++t)
      k.key_of.push_back(static_cast<uint32_t>(Rand(k.rkeys.size())));
    m->caches.push_back(std::move(k));
  }
}

// Round trip, prefixes and corruption for one message type. `prefix_ok(len)`: a strict prefix of
// that length that is itself a valid form of the message (CACHE_QUERY by id is a prefix of by key).
template <typename T, typename PrefixOk>
void Exercise(int rounds, PrefixOk prefix_ok) {
  for (int round = 0; round < rounds; ++round) {
    T m;
    Random(&m);
    std::string wire, again;
    Encode(m, &wire);
    T back;
    CHECK(Decode(wire, &back));
    Encode(back, &again);
    CHECK(again == wire);  // field-agnostic: whatever the decoder kept, it re-encodes the same
    for (size_t len = 0; len < wire.size(); ++len) {
      T cut;
      if (!prefix_ok(len)) CHECK(!Decode(wire.substr(0, len), &cut));
    }
    CHECK(!Decode(wire + '\0', &back) || prefix_ok(wire.size()));
    for (int k = 0; k < 64 && !wire.empty(); ++k) {  // corruption: decoded or refused, re-encodes stably
      std::string bad = wire;
      for (int flips = 1 + static_cast<int>(Rand(4)); flips > 0; --flips)
        bad[Rand(bad.size())] ^= static_cast<char>(1 + Rand(255));
      T got;
      if (!Decode(bad, &got)) continue;
      std::string e1, e2;
      Encode(got, &e1);
      T got2;
      CHECK(Decode(e1, &got2));
      Encode(got2, &e2);
      CHECK(e1 == e2);
    }
  }
}
template <typename T>
void Exercise(int rounds) {
  Exercise<T>(rounds, [](size_t) { return false; });
}

}  // namespace

TEST(wire_hello_round_trip_prefixes_and_corruption) { Exercise<Hello>(200); }
TEST(wire_challenge_round_trip_prefixes_and_corruption) { Exercise<Challenge>(200); }
TEST(wire_auth_round_trip_prefixes_and_corruption) { Exercise<AuthProof>(200); }
TEST(wire_link_info_round_trip_prefixes_and_corruption) { Exercise<LinkInfoMsg>(40); }
TEST(wire_bind_round_trip_prefixes_and_corruption) { Exercise<Bind>(50); }
TEST(wire_confirm_round_trip_prefixes_and_corruption) { Exercise<Confirm>(200); }
TEST(wire_cache_ref_round_trip_prefixes_and_corruption) { Exercise<CacheRef>(50); }
TEST(wire_xfer_request_round_trip_prefixes_and_corruption) { Exercise<XferRequest>(100); }
TEST(wire_notify_round_trip_prefixes_and_corruption) { Exercise<Notify>(40); }
TEST(wire_key_ref_round_trip_prefixes_and_corruption) { Exercise<KeyRef>(100); }
TEST(wire_cache_info_round_trip_prefixes_and_corruption) { Exercise<CacheInfo>(100); }
TEST(wire_ucx_info_round_trip_prefixes_and_corruption) { Exercise<UcxInfo>(60); }
// Opaque after its id byte: every prefix that keeps the id is a (shorter) valid frame; the backend's
// own decoder judges the data (UcxInfo above).
TEST(wire_backend_attach_round_trip_prefixes_and_corruption) {
  Exercise<BackendAttach>(60, [](size_t len) { return len >= 1; });
}
TEST(wire_crc_mismatch_round_trip_prefixes_and_corruption) { Exercise<CrcMismatch>(100); }
TEST(wire_cache_query_round_trip_prefixes_and_corruption) {
  std::string by_id;
  Encode(CacheQuery{}, &by_id);
  const size_t id_form = by_id.size();
  Exercise<CacheQuery>(200, [&](size_t len) { return len == id_form; });
}

TEST(wire_hello_of_another_version_is_refused) {
  Hello h;
  Random(&h);
  for (uint32_t v : {0u, kProtocolVersion - 1, kProtocolVersion + 1, 0xFFFFFFFFu}) {
    h.version = v;
    std::string wire;
    Encode(h, &wire);
    Hello back;
    CHECK(!Decode(wire, &back));
  }
}

TEST(wire_header_round_trip_and_magic) {
  FrameHeader h{kReadReq, kFlagInline, 0xDEADBEEF, 1ULL << 40}, back;
  uint8_t buf[kFrameHeaderBytes];
  EncodeHeader(h, buf);
  CHECK(DecodeHeader(buf, &back));
  CHECK(back.type == h.type && back.flags == h.flags && back.status == h.status && back.length == h.length);
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {  // every byte but the reserved word means something
    if (i >= 12 && i < 16) continue;                 // reserved: ignored by the decoder
    uint8_t bad[kFrameHeaderBytes];
    std::memcpy(bad, buf, sizeof(bad));
    bad[i] ^= 0xFF;
    FrameHeader got;
    if (!DecodeHeader(bad, &got)) continue;
    CHECK(got.type != h.type || got.flags != h.flags || got.status != h.status || got.length != h.length);
  }
}

// A request whose counts promise more than its bytes hold is refused before anything is allocated
// (a 64-byte frame must never reserve 4 G tensor slots).
TEST(wire_xfer_request_counts_must_match_the_payload) {
  for (uint32_t nt : {1u, 1000u, 0xFFFFFFFFu}) {
    Writer w;
    w.Put<int64_t>(1);
    w.Put<int64_t>(2);
    w.Put<int64_t>(3);
    w.Put<uint32_t>(nt);
    w.Put<uint32_t>(0xFFFFFFFFu);
    w.Put<uint64_t>(0);
    w.Put<uint32_t>(7);
    XferRequest m;
    CHECK(!Decode(w.buf, &m));
    CHECK(m.tensors.capacity() < 1000 && m.ranges.capacity() < 1000);
  }
}

TEST(wire_notify_longer_than_the_limits_is_refused) {
  Notify m;
  m.name = std::string(kMaxNotifyName + 1, 'n');
  std::string wire;
  Encode(m, &wire);
  Notify back;
  CHECK(!Decode(wire, &back));
  m.name = "n";
  m.message = std::string(kMaxNotifyMessage + 1, 'm');
  Encode(m, &wire);
  CHECK(!Decode(wire, &back));
  m.message = std::string(kMaxNotifyMessage, 'm');
  Encode(m, &wire);
  CHECK(Decode(wire, &back) && back.message == m.message);
}

TEST(wire_every_payload_limit_is_named_once_per_channel) {
  for (const PayloadLimit &a : kPayloadLimits) {
    int seen = 0;
    for (const PayloadLimit &b : kPayloadLimits) seen += a.type == b.type && a.channel == b.channel;
    CHECK(seen == 1);
    CHECK(MaxPayload(a.type, a.channel) == a.max);
  }
  CHECK(MaxPayload(kReadResp, Channel::kControl) == kSmallPayload);  // anything unlisted is small
}
