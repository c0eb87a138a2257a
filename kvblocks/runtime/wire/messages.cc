// SPDX-License-Identifier: Apache-2.0
#include "wire/messages.h"

#include "wire/codec.h"

namespace kvblocks {
namespace {

void Put(Writer *w, const PeerIdentity &id) {
  w->PutBytes(id.boot_id, sizeof(id.boot_id));
  w->Put<uint64_t>(id.netns);
  w->Put<uint64_t>(id.instance);
  w->Put<uint64_t>(id.probe_addr);
  w->Put<uint64_t>(id.probe_value);
}

void Get(Reader *r, PeerIdentity *id) {
  r->GetBytes(id->boot_id, sizeof(id->boot_id));
  id->netns = r->Get<uint64_t>();
  id->instance = r->Get<uint64_t>();
  id->probe_addr = r->Get<uint64_t>();
  id->probe_value = r->Get<uint64_t>();
}

void Put(Writer *w, const LinkInfo &m) {
  w->Put<uint64_t>(m.capabilities);
  Put(w, m.identity);
  w->Put<int64_t>(m.clock_ns);
  w->Put<uint8_t>(static_cast<uint8_t>(m.local_name.size()));
  w->PutBytes(m.local_name.data(), m.local_name.size());
  w->PutBytes(m.local_key, sizeof(m.local_key));
  EncodeTable(m.caches, w);
}

void Get(Reader *r, LinkInfo *m) {
  m->capabilities = r->Get<uint64_t>();
  Get(r, &m->identity);
  m->clock_ns = r->Get<int64_t>();
  const uint8_t name_len = r->Get<uint8_t>();
  if (!r->ok || name_len > kMaxLocalName || name_len > r->left()) return void(r->ok = false);
  m->local_name.assign(reinterpret_cast<const char *>(r->p + r->off), name_len);
  r->Skip(name_len);
  r->GetBytes(m->local_key, sizeof(m->local_key));
  if (r->ok && !DecodeTable(r, &m->caches)) r->ok = false;
}

template <typename Fn>
bool DecodeAll(const std::string &in, Fn &&fn) {
  Reader r(in);
  fn(&r);
  return r.done();
}

}  // namespace

const uint8_t kZeroPad[kDataAlign] = {};

void EncodeHeader(const FrameHeader &h, uint8_t out[kFrameHeaderBytes]) {
  Writer w;
  w.Put<uint32_t>(kMagic);
  w.Put<uint16_t>(h.type);
  w.Put<uint16_t>(h.flags);
  w.Put<uint32_t>(h.status);
  w.Put<uint32_t>(0);
  w.Put<uint64_t>(h.length);
  memcpy(out, w.buf.data(), kFrameHeaderBytes);
}

bool DecodeHeader(const uint8_t in[kFrameHeaderBytes], FrameHeader *h) {
  Reader r(in, kFrameHeaderBytes);
  const uint32_t magic = r.Get<uint32_t>();
  h->type = r.Get<uint16_t>();
  h->flags = r.Get<uint16_t>();
  h->status = r.Get<uint32_t>();
  r.Get<uint32_t>();
  h->length = r.Get<uint64_t>();
  return r.done() && magic == kMagic;
}

void Encode(const Hello &m, std::string *out) {
  Writer w;
  w.Put<uint32_t>(m.version);
  w.Put<uint32_t>(static_cast<uint32_t>(m.kind));
  w.Put<uint64_t>(m.cluster_id);
  w.PutBytes(m.nonce, sizeof(m.nonce));
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, Hello *m) {
  return DecodeAll(in, [&](Reader *r) {
    m->version = r->Get<uint32_t>();
    const uint32_t kind = r->Get<uint32_t>();
    m->kind = static_cast<ConnKind>(kind);
    m->cluster_id = r->Get<uint64_t>();
    r->GetBytes(m->nonce, sizeof(m->nonce));
    // Checked last, so a HELLO of another version still names its sender in the listener's log.
    if (m->version != kProtocolVersion || kind < 1 || kind > 3) r->ok = false;
  });
}

void Encode(const Challenge &m, std::string *out) {
  Writer w;
  w.PutBytes(m.nonce, sizeof(m.nonce));
  w.Put<uint8_t>(m.auth_required);
  w.Put<uint8_t>(m.has_proof);
  w.PutBytes(m.proof, sizeof(m.proof));
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, Challenge *m) {
  return DecodeAll(in, [&](Reader *r) {
    r->GetBytes(m->nonce, sizeof(m->nonce));
    m->auth_required = r->Get<uint8_t>() != 0;
    m->has_proof = r->Get<uint8_t>() != 0;
    r->GetBytes(m->proof, sizeof(m->proof));
  });
}

void Encode(const AuthProof &m, std::string *out) {
  Writer w;
  w.Put<uint8_t>(m.has_proof);
  w.PutBytes(m.proof, sizeof(m.proof));
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, AuthProof *m) {
  return DecodeAll(in, [&](Reader *r) {
    m->has_proof = r->Get<uint8_t>() == 1;
    r->GetBytes(m->proof, sizeof(m->proof));
  });
}

void Encode(const LinkInfoMsg &m, std::string *out) {
  Writer w;
  w.Put<uint64_t>(m.cluster_id);
  w.PutBytes(m.link_token, sizeof(m.link_token));
  Put(&w, m.info);
  w.PutBytes(m.inproc_proof, sizeof(m.inproc_proof));  // last: it covers every byte before it
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, LinkInfoMsg *m) {
  return DecodeAll(in, [&](Reader *r) {
    m->cluster_id = r->Get<uint64_t>();
    r->GetBytes(m->link_token, sizeof(m->link_token));
    Get(r, &m->info);
    r->GetBytes(m->inproc_proof, sizeof(m->inproc_proof));
  });
}

void Encode(const Bind &m, std::string *out) {
  Writer w;
  w.PutBytes(m.mac, sizeof(m.mac));
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, Bind *m) {
  return DecodeAll(in, [&](Reader *r) { r->GetBytes(m->mac, sizeof(m->mac)); });
}

void Encode(const Transcript &m, std::string *out) {
  Writer w;
  w.Put<uint32_t>(kProtocolVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(m.kind));
  w.Put<uint64_t>(m.opener_cluster_id);
  w.Put<uint64_t>(m.listener_cluster_id);
  w.PutBytes(m.client_nonce, sizeof(m.client_nonce));
  w.PutBytes(m.server_nonce, sizeof(m.server_nonce));
  w.Put<uint8_t>(m.listener.family);
  w.PutBytes(m.listener.ip, sizeof(m.listener.ip));
  w.Put<uint16_t>(m.listener.port);
  *out = std::move(w.buf);
}

void Encode(const Confirm &m, std::string *out) {
  Writer w;
  w.Put<int64_t>(m.clock_offset_ns);
  w.Put<uint8_t>(m.local_exchange);
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, Confirm *m) {
  return DecodeAll(in, [&](Reader *r) {
    m->clock_offset_ns = r->Get<int64_t>();
    m->local_exchange = r->Get<uint8_t>() == 1;
  });
}

void Encode(const CacheRef &m, std::string *out) {
  Writer w;
  w.Put<int64_t>(m.cache_id);
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, CacheRef *m) {
  return DecodeAll(in, [&](Reader *r) { m->cache_id = r->Get<int64_t>(); });
}

void Encode(const KeyRef &m, std::string *out) {
  Writer w;
  w.Put<int64_t>(m.cache_id);
  w.Put<int64_t>(m.key);
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, KeyRef *m) {
  return DecodeAll(in, [&](Reader *r) {
           m->cache_id = r->Get<int64_t>();
           m->key = r->Get<int64_t>();
         }) &&
         m->key >= 0;
}

void Encode(const CacheQuery &m, std::string *out) {
  Writer w;
  w.Put<int64_t>(m.cache_id);
  w.Put<uint64_t>(m.seq);
  if (m.kind != kQueryById) {
    w.Put<uint8_t>(m.kind);
    w.Put<int64_t>(m.key);
  }
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, CacheQuery *m) {
  m->kind = kQueryById;
  m->key = -1;
  return DecodeAll(in, [&](Reader *r) {
    m->cache_id = r->Get<int64_t>();
    m->seq = r->Get<uint64_t>();
    if (r->off == r->n) return;  // by id: the capability-32 form
    const uint8_t kind = r->Get<uint8_t>();
    m->key = r->Get<int64_t>();
    if (kind != kQueryByCacheKey && kind != kQueryByBatchKey) return void(r->ok = false);
    m->kind = static_cast<CacheQueryKind>(kind);
  }) && (m->kind == kQueryById || (m->key >= 0 && m->cache_id == 0));
}

void Encode(const CacheInfo &m, std::string *out) {
  Writer w;
  w.Put<int64_t>(m.cache_id);
  w.Put<uint64_t>(m.seq);
  std::vector<TableEntry> one;
  if (m.found) one.push_back(m.entry);
  EncodeTable(one, &w);
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, CacheInfo *m) {
  std::vector<TableEntry> got;
  const bool ok = DecodeAll(in, [&](Reader *r) {
    m->cache_id = r->Get<int64_t>();
    m->seq = r->Get<uint64_t>();
    // The count comes first: refuse more than one entry before decoding any.
    Reader count = *r;
    if (count.Get<uint32_t>() > 1 || !count.ok) return void(r->ok = false);
    if (!DecodeTable(r, &got)) r->ok = false;
  });
  if (!ok || got.size() > 1 || (got.size() == 1 && got[0].id != m->cache_id)) return false;
  m->found = got.size() == 1;
  if (m->found) m->entry = std::move(got[0]);
  return true;
}

void Encode(const BackendAttach &m, std::string *out) {
  Writer w;
  w.Put<uint8_t>(m.backend);
  w.PutBytes(m.data.data(), m.data.size());
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, BackendAttach *m) {
  if (in.empty()) return false;
  m->backend = static_cast<uint8_t>(in[0]);
  m->data.assign(in, 1, std::string::npos);
  return true;
}

void Encode(const XferRequest &m, std::string *out) {
  Writer w;
  w.buf.reserve(40 + m.tensors.size() * 4 + m.ranges.size() * 16);
  w.Put<int64_t>(m.cache_id);
  w.Put<int64_t>(m.deadline);
  w.Put<int64_t>(m.budget);
  w.Put<uint32_t>(static_cast<uint32_t>(m.tensors.size()));
  w.Put<uint32_t>(static_cast<uint32_t>(m.ranges.size()));
  w.Put<uint64_t>(m.total);
  for (uint32_t t : m.tensors) w.Put<uint32_t>(t);
  for (const ByteRange &g : m.ranges) {
    w.Put<uint64_t>(g.offset);
    w.Put<uint64_t>(g.length);
  }
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, XferRequest *m) {
  return DecodeAll(in, [&](Reader *r) {
    m->cache_id = r->Get<int64_t>();
    m->deadline = r->Get<int64_t>();
    m->budget = r->Get<int64_t>();
    const uint32_t nt = r->Get<uint32_t>();
    const uint32_t nr = r->Get<uint32_t>();
    m->total = r->Get<uint64_t>();
    // Allocate only what the payload really holds: the counts are the peer's word.
    if (!r->ok || r->left() != uint64_t{nt} * 4 + uint64_t{nr} * 16) return void(r->ok = false);
    m->tensors.resize(nt);
    for (uint32_t &t : m->tensors) t = r->Get<uint32_t>();
    m->ranges.resize(nr);
    for (ByteRange &g : m->ranges) {
      g.offset = r->Get<uint64_t>();
      g.length = r->Get<uint64_t>();
    }
  });
}

void Encode(const Notify &m, std::string *out) {
  Writer w;
  w.Put<uint64_t>(m.seq);
  w.Put<uint32_t>(m.status);
  w.Put<uint32_t>(static_cast<uint32_t>(m.name.size()));
  w.Put<uint32_t>(static_cast<uint32_t>(m.message.size()));
  w.PutBytes(m.name.data(), m.name.size());
  w.PutBytes(m.message.data(), m.message.size());
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, Notify *m) {
  return DecodeAll(in, [&](Reader *r) {
    m->seq = r->Get<uint64_t>();
    m->status = r->Get<uint32_t>();
    const uint32_t nl = r->Get<uint32_t>(), ml = r->Get<uint32_t>();
    if (!r->ok || nl > kMaxNotifyName || ml > kMaxNotifyMessage || r->left() != uint64_t{nl} + ml) {
      r->ok = false;
      return;
    }
    m->name.assign(reinterpret_cast<const char *>(r->p + r->off), nl);
    m->message.assign(reinterpret_cast<const char *>(r->p + r->off + nl), ml);
    r->Skip(uint64_t{nl} + ml);
  });
}

void Encode(const CrcMismatch &m, std::string *out) {
  Writer w;
  w.Put<uint64_t>(m.pair);
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, CrcMismatch *m) {
  return DecodeAll(in, [&](Reader *r) { m->pair = r->Get<uint64_t>(); });
}

}  // namespace kvblocks
