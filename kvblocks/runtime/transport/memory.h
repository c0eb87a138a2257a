// SPDX-License-Identifier: Apache-2.0
// Registered memory as the paths and backends see it: the tensors of one of our caches, how a
// transfer holds it (MemoryUse) and the backends' registrations of it. cache/ builds it (a
// CacheEntry is one, with the engine's bookkeeping besides) and serves lookups by id (LocalTable).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_MEMORY_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <vector>

#include "common/mem_kind.h"
#include "transport/region.h"

namespace kvblocks {

struct LocalMemory {
  int64_t id = 0;
  uint32_t num_tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t stride = 0;  // bytes per block / batch row
  std::vector<uint64_t> addrs;
  std::shared_ptr<SharedRegion> region;  // set for an allocated cache: a memfd same-host peers may map
  uint64_t pitch = 0;                    // distance between tensors inside region
  MemRef mem;  // the kind of memory the tensors live in (host: the only kind registered today)
  mutable std::shared_timed_mutex use_mu;  // transfers hold it shared; unregister exclusive
  bool removed = false;                    // set under exclusive use_mu when unregistered
  // Set while an unregister is in progress: new transfers and links no longer see the memory.
  // Reset when the unregister fails and it stays registered.
  std::atomic<bool> closing{false};
  // Data channels whose serving thread holds this memory; an unregister past its time budget shuts
  // them down rather than waiting out a deadline the peer chose.
  std::mutex serving_mu;
  std::multiset<int> serving_fds;
  // Backends' registrations of this memory (a network backend's memory map, say), keyed by backend:
  // made on first need, dropped by that backend's Unregister once peers stopped using it.
  mutable std::mutex regs_mu;
  std::map<const void *, std::shared_ptr<void>> regs;

  uint8_t *tensor(uint32_t i) const { return reinterpret_cast<uint8_t *>(addrs[i]); }
};

// Holds memory for the duration of a transfer; `ok` is false once it has been unregistered, so a
// transfer that looked it up just before removal never touches freed memory.
struct MemoryUse {
  std::shared_lock<std::shared_timed_mutex> lock;
  bool ok;
  explicit MemoryUse(const LocalMemory &e) : lock(e.use_mu), ok(!e.removed && !e.closing.load()) {}
};

// Registers a serving thread's channel with the memory it holds (see LocalMemory::serving_fds).
class ServingFd {
 public:
  ServingFd(LocalMemory *e, int fd) : e_(e), fd_(fd) {
    std::lock_guard<std::mutex> g(e_->serving_mu);
    e_->serving_fds.insert(fd_);
  }
  ~ServingFd() {
    std::lock_guard<std::mutex> g(e_->serving_mu);
    e_->serving_fds.erase(e_->serving_fds.find(fd_));
  }
  ServingFd(const ServingFd &) = delete;
  ServingFd &operator=(const ServingFd &) = delete;

 private:
  LocalMemory *e_;
  int fd_;
};

// Our registered memory by id (the engine's cache registry), for the serving side.
class LocalTable {
 public:
  virtual std::shared_ptr<LocalMemory> FindMemory(int64_t id) const = 0;

 protected:
  ~LocalTable() = default;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_MEMORY_H_
