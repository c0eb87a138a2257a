// SPDX-License-Identifier: Apache-2.0
// Runtime-owned shared memory (memfd), mappable by a same-host peer.
#ifndef KVBLOCKS_RUNTIME_CACHE_REGION_H_
#define KVBLOCKS_RUNTIME_CACHE_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvblocks {

struct SharedRegion {
  int fd = -1;
  uint8_t *base = nullptr;
  size_t size = 0;
  uint64_t ino = 0, dev = 0;
  ~SharedRegion();
  static std::shared_ptr<SharedRegion> Create(size_t size);
  // Maps a peer's region through /proc/<pid>/fd/<fd>; verifies the inode so a recycled pid or fd
  // cannot alias another file.
  static std::shared_ptr<SharedRegion> MapPeer(int pid, int fd, uint64_t ino, uint64_t dev, size_t size);
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_CACHE_REGION_H_
