// SPDX-License-Identifier: Apache-2.0
#include "wire/table.h"

#include "common/limits.h"
#include "wire/codec.h"

namespace kvblocks {
namespace {

void PutDescriptor(Writer *w, uint8_t kind, const Writer &body) {
  w->Put<uint8_t>(kind);
  w->Put<uint32_t>(static_cast<uint32_t>(body.buf.size()));
  w->PutBytes(body.buf.data(), body.buf.size());
}

bool Consistent(const TableEntry &c) {
  uint64_t span;
  if (c.num_tensors == 0 || c.num_tensors > kMaxTableTensors || c.tensor_bytes == 0 || c.stride == 0) return false;
  if (__builtin_mul_overflow(c.num_blocks, c.stride, &span) || span > c.tensor_bytes) return false;
  if (__builtin_mul_overflow(c.batch_size, c.stride, &span) || span > c.tensor_bytes) return false;
  if (!c.addrs.empty() && c.addrs.size() != c.num_tensors) return false;
  if (c.batch_keys.size() > c.batch_size) return false;
  if (!c.has_memfd) return true;
  // The memfd descriptor drives one-sided copies into mapped memory: every tensor must fit.
  uint64_t last, end;
  const MemfdDesc &m = c.memfd;
  return m.fd >= 0 && m.pitch >= c.tensor_bytes &&
         !__builtin_mul_overflow(m.pitch, uint64_t{c.num_tensors - 1}, &last) &&
         !__builtin_add_overflow(last, c.tensor_bytes, &end) && end <= m.region_size;
}

bool GetDescriptor(Reader *r, TableEntry *c) {
  const uint8_t kind = r->Get<uint8_t>();
  const uint32_t len = r->Get<uint32_t>();
  if (!r->ok || len > r->left()) return false;
  Reader body(r->p + r->off, len);
  r->Skip(len);
  if (kind == kDescMemfd) {
    c->has_memfd = true;
    c->memfd.fd = body.Get<int32_t>();
    c->memfd.ino = body.Get<uint64_t>();
    c->memfd.dev = body.Get<uint64_t>();
    c->memfd.region_size = body.Get<uint64_t>();
    c->memfd.pitch = body.Get<uint64_t>();
  } else if (kind == kDescAddrs) {
    if (len % 8 != 0 || len / 8 != c->num_tensors) return false;
    c->addrs.resize(c->num_tensors);
    for (uint64_t &a : c->addrs) a = body.Get<uint64_t>();
  } else if (kind == kDescBatchKeys) {
    if (len % 8 != 0 || len / 8 > kMaxTableTensors) return false;
    c->batch_keys.resize(len / 8);
    for (int64_t &k : c->batch_keys) k = body.Get<int64_t>();
  } else {
    return true;  // a backend we do not know (or kind 4, retired: see table.h): skip it
  }
  return body.done();
}

}  // namespace

uint64_t TableFootprint(const TableEntry &c) {
  return kTableEntryBytes + 8 * (c.addrs.size() + c.batch_keys.size());
}

void EncodeTable(const std::vector<TableEntry> &caches, Writer *w) {
  w->Put<uint32_t>(static_cast<uint32_t>(caches.size()));
  for (const TableEntry &c : caches) {
    w->Put<int64_t>(c.id);
    w->Put<uint8_t>(static_cast<uint8_t>(c.kind));
    w->Put<int64_t>(c.key);
    w->Put<uint32_t>(c.num_tensors);
    w->Put<uint64_t>(c.tensor_bytes);
    w->Put<uint64_t>(c.num_blocks);
    w->Put<uint64_t>(c.batch_size);
    w->Put<uint64_t>(c.stride);
    w->Put<uint16_t>(static_cast<uint16_t>(c.has_memfd) + static_cast<uint16_t>(!c.addrs.empty()) +
                     static_cast<uint16_t>(!c.batch_keys.empty()));
    if (c.has_memfd) {
      Writer b;
      b.Put<int32_t>(c.memfd.fd);
      b.Put<uint64_t>(c.memfd.ino);
      b.Put<uint64_t>(c.memfd.dev);
      b.Put<uint64_t>(c.memfd.region_size);
      b.Put<uint64_t>(c.memfd.pitch);
      PutDescriptor(w, kDescMemfd, b);
    }
    if (!c.addrs.empty()) {
      Writer b;
      for (uint64_t a : c.addrs) b.Put<uint64_t>(a);
      PutDescriptor(w, kDescAddrs, b);
    }
    if (!c.batch_keys.empty()) {
      Writer b;
      for (int64_t k : c.batch_keys) b.Put<int64_t>(k);
      PutDescriptor(w, kDescBatchKeys, b);
    }
  }
}

bool DecodeTable(Reader *r, std::vector<TableEntry> *caches) {
  const uint32_t count = r->Get<uint32_t>();
  if (!r->ok || count > kMaxLinkCaches) return false;
  uint64_t footprint = 0;
  for (uint32_t i = 0; i < count; ++i) {
    TableEntry c;
    c.id = r->Get<int64_t>();
    const uint8_t kind = r->Get<uint8_t>();
    c.kind = static_cast<CacheKind>(kind);
    c.key = r->Get<int64_t>();
    c.num_tensors = r->Get<uint32_t>();
    c.tensor_bytes = r->Get<uint64_t>();
    c.num_blocks = r->Get<uint64_t>();
    c.batch_size = r->Get<uint64_t>();
    c.stride = r->Get<uint64_t>();
    const uint16_t ndesc = r->Get<uint16_t>();
    if (!r->ok || kind > 2 || c.num_tensors > kMaxTableTensors) return false;
    for (uint16_t d = 0; d < ndesc; ++d)
      if (!GetDescriptor(r, &c)) return false;
    if (!Consistent(c) || (footprint += TableFootprint(c)) > kMaxLinkTableBytes) return false;
    caches->push_back(std::move(c));
  }
  return r->ok;
}

}  // namespace kvblocks
