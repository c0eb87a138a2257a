// SPDX-License-Identifier: Apache-2.0
// The kind of memory a cache lives in, apart from CANN's placement (CachePlacement::kDevice means
// "CANN's DEVICE rule", served by host memory here): every cache entry and table entry carries one,
// and a backend says which pairs (local, remote) it can move bytes between. Host is the only kind
// a backend serves today.
#ifndef KVBLOCKS_RUNTIME_COMMON_MEM_KIND_H_
#define KVBLOCKS_RUNTIME_COMMON_MEM_KIND_H_

#include <cstdint>

namespace kvblocks {

enum class MemKind : uint8_t {
  kHost = 0,  // addressable by this process's CPU
  kCuda = 1,  // CUDA device memory (no backend serves it yet)
};

struct MemRef {
  MemKind kind = MemKind::kHost;
  int32_t device = -1;  // the device ordinal; -1 for host memory
};

inline const char *MemKindName(MemKind k) { return k == MemKind::kHost ? "host" : "cuda"; }

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_COMMON_MEM_KIND_H_
