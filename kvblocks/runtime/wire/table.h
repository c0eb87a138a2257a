// SPDX-License-Identifier: Apache-2.0
// The cache table exchanged at link time. Each entry carries per-backend descriptors, so a peer
// that does not know a backend skips its descriptor and still links over the served path.
#ifndef KVBLOCKS_RUNTIME_WIRE_TABLE_H_
#define KVBLOCKS_RUNTIME_WIRE_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/mem_kind.h"
#include "kvblocks/ext.h"

namespace kvblocks {

struct Writer;
struct Reader;

enum DescriptorKind : uint8_t {
  kDescMemfd = 1,  // a runtime-owned memfd a same-host peer may map
  kDescAddrs = 2,  // tensor addresses in the owner's address space (same-host and in-process backends)
  kDescBatchKeys = 3,  // the key bound to each batch index (CANN's cache_keys[i]; -1: none)
  // 4: retired (descriptors that reach memory without its owner serving it, shown to every linked
  // peer); such descriptors now go in BACKEND_ATTACH, after CONFIRM, to that peer only
  // (wire/messages.h). Skipped as unknown.
};

struct MemfdDesc {
  int32_t fd = -1;
  uint64_t ino = 0, dev = 0, region_size = 0;
  uint64_t pitch = 0;  // bytes between tensors inside the region
};

struct TableEntry {
  int64_t id = 0;
  CacheKind kind = CacheKind::kMix;
  int64_t key = -1;
  uint32_t num_tensors = 0;
  uint64_t tensor_bytes = 0, num_blocks = 0, batch_size = 0, stride = 0;
  // Not on the wire yet: every peer's cache is host memory until a backend serves another kind (its
  // descriptor kind will carry it; a peer that does not know it skips it and stays on host paths).
  MemRef mem;
  bool has_memfd = false;
  MemfdDesc memfd;
  std::vector<uint64_t> addrs;  // empty when not announced
  std::vector<int64_t> batch_keys;  // batch_keys[i] is bound to batch index i; empty when none
};

// The memory an entry holds once decoded and kept by a link (an upper estimate), for
// kMaxLinkTableBytes.
uint64_t TableFootprint(const TableEntry &c);

void EncodeTable(const std::vector<TableEntry> &caches, Writer *w);
// Rejects entries that are not self-consistent (sizes, counts, descriptor bounds), and a table of
// more than kMaxLinkCaches entries or kMaxLinkTableBytes of footprint.
bool DecodeTable(Reader *r, std::vector<TableEntry> *caches);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_WIRE_TABLE_H_
