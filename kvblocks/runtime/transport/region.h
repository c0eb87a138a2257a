// SPDX-License-Identifier: Apache-2.0
// Runtime-owned shared memory (memfd), mappable by a same-host peer.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_REGION_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_REGION_H_

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
  // Maps `size` bytes of a memfd a same-host peer passed with SCM_RIGHTS (takes the fd); null
  // unless it is a regular file sealed against shrinking and at least `size` long.
  static std::shared_ptr<SharedRegion> MapReceived(int fd, size_t size);
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_REGION_H_
