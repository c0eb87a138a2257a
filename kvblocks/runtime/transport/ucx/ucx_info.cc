// SPDX-License-Identifier: Apache-2.0
// UCX_INFO's encoder and decoder (ucx_info.h), with the shared codec of every wire message.
#include "transport/ucx/ucx_info.h"

#include "common/limits.h"
#include "wire/codec.h"

namespace kvblocks {

namespace {

void PutBlob(Writer *w, const std::string &s) {
  w->Put<uint32_t>(static_cast<uint32_t>(s.size()));
  w->PutBytes(s.data(), s.size());
}

bool GetBlob(Reader *r, std::string *out) {
  const uint32_t len = r->Get<uint32_t>();
  if (!r->ok || len == 0 || len > kMaxUcxBlob || len > r->left()) return r->ok = false;
  out->resize(len);
  return r->GetBytes(&(*out)[0], len);
}

// One cache's keys: rkey count, the rkeys, tensor count, each tensor's rkey index.
bool GetUcxKeys(Reader *r, UcxCacheKeys *k) {
  k->cache_id = r->Get<int64_t>();
  const uint32_t nkeys = r->Get<uint32_t>();
  if (!r->ok || nkeys == 0 || nkeys > kMaxTableTensors || nkeys > r->left() / 5) return false;
  k->rkeys.resize(nkeys);
  for (std::string &s : k->rkeys)
    if (!GetBlob(r, &s)) return false;
  const uint32_t ntensors = r->Get<uint32_t>();
  if (!r->ok || ntensors == 0 || ntensors > kMaxTableTensors || ntensors > r->left() / 4) return false;
  k->key_of.resize(ntensors);
  for (uint32_t &i : k->key_of)
    if ((i = r->Get<uint32_t>()) >= nkeys) return false;
  return r->ok;
}

}  // namespace

void Encode(const UcxInfo &m, std::string *out) {
  Writer w;
  PutBlob(&w, m.worker);
  w.Put<uint32_t>(static_cast<uint32_t>(m.caches.size()));
  for (const UcxCacheKeys &k : m.caches) {
    w.Put<int64_t>(k.cache_id);
    w.Put<uint32_t>(static_cast<uint32_t>(k.rkeys.size()));
    for (const std::string &s : k.rkeys) PutBlob(&w, s);
    w.Put<uint32_t>(static_cast<uint32_t>(k.key_of.size()));
    for (uint32_t i : k.key_of) w.Put<uint32_t>(i);
  }
  *out = std::move(w.buf);
}

bool Decode(const std::string &in, UcxInfo *m) {
  Reader r(in);
  const uint32_t len = r.Get<uint32_t>();  // 0: no UCX from this side
  if (!r.ok || len > kMaxUcxBlob || len > r.left()) return false;
  m->worker.resize(len);
  if (len != 0) r.GetBytes(&m->worker[0], len);
  const uint32_t n = r.Get<uint32_t>();
  if (!r.ok || n > kMaxLinkCaches || n > r.left() / 16 || (len == 0 && n != 0)) return false;
  m->caches.resize(n);
  for (UcxCacheKeys &k : m->caches)
    if (!GetUcxKeys(&r, &k)) return false;
  return r.done();
}

}  // namespace kvblocks
