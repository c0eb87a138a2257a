// SPDX-License-Identifier: Apache-2.0
// The cache table exchanged at link time. Each entry carries per-transport descriptors, so a peer
// that does not know a transport skips its descriptor and still links over TCP.
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
  kDescAddrs = 2,  // tensor addresses in the owner's address space (CMA, in-process)
  kDescBatchKeys = 3,  // the key bound to each batch index (CANN's cache_keys[i]; -1: none)
  // 4: retired (UCX worker address and rkeys, shown to every linked peer); now in UCX_INFO, after
  // CONFIRM, to UCX peers only (wire/messages.h). Skipped as unknown.
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
  // Never in the table: the owner's UCP worker address, its packed rkeys and the rkey of each tensor,
  // learned from UCX_INFO (ucx_key_of is empty when not announced; it needs addrs).
  std::string ucx_worker;
  std::vector<std::string> ucx_rkeys;
  std::vector<uint32_t> ucx_key_of;
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
