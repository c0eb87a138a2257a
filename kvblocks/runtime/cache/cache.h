// SPDX-License-Identifier: Apache-2.0
// A registered or allocated cache, and the registry of this engine's caches.
#ifndef KVBLOCKS_RUNTIME_CACHE_CACHE_H_
#define KVBLOCKS_RUNTIME_CACHE_CACHE_H_

#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <vector>

#include "cache/region.h"
#include "common/mem_kind.h"
#include "wire/table.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct CacheEntry {
  int64_t id = 0;
  CacheKind kind = CacheKind::kMix;
  int64_t key = -1;
  llm_datadist::CacheDesc desc;
  uint32_t num_tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t num_blocks = 0;  // 0 for kCache
  uint64_t batch_size = 0;
  uint64_t stride = 0;  // bytes per block / batch row
  std::vector<uint64_t> addrs;
  std::vector<int64_t> batch_keys;       // kvblocks extension: a key per batch index (table.h)
  bool free_when_unbound = false;        // deallocate deferred until the last batch key is released
  std::shared_ptr<SharedRegion> region;  // set for AllocateCache
  uint64_t pitch = 0;                    // distance between tensors inside region
  mutable std::shared_timed_mutex use_mu;  // transfers hold it shared; unregister exclusive
  bool removed = false;                    // set under exclusive use_mu when unregistered
  // Set while an unregister is in progress: new transfers and links no longer see the cache. Reset
  // when the unregister fails and the cache stays registered.
  std::atomic<bool> closing{false};
  std::mutex remove_mu;  // one unregister of this cache at a time
  // Data channels whose serving thread holds this cache; an unregister past its time budget shuts
  // them down rather than waiting out a deadline the peer chose.
  std::mutex serving_mu;
  std::multiset<int> serving_fds;
  // Backends' registrations of this cache (a network backend's memory map, say), keyed by backend: made on first
  // need, dropped by that backend's Unregister once peers stopped using the cache.
  mutable std::mutex regs_mu;
  std::map<const void *, std::shared_ptr<void>> regs;
  MemRef mem;  // the kind of memory the tensors live in (host: the only kind registered today)

  uint8_t *tensor(uint32_t i) const { return reinterpret_cast<uint8_t *>(addrs[i]); }
  TableEntry Describe() const;  // the entry peers see in the link-time table (every backend's part)
};

// Holds a cache for the duration of a transfer; `ok` is false once it has been unregistered, so a
// transfer that looked the cache up just before removal never touches freed memory.
struct CacheUse {
  std::shared_lock<std::shared_timed_mutex> lock;
  bool ok;
  explicit CacheUse(const CacheEntry &e) : lock(e.use_mu), ok(!e.removed && !e.closing.load()) {}
};

// Registers a serving thread's channel with the cache it holds (see CacheEntry::serving_fds).
class ServingFd {
 public:
  ServingFd(CacheEntry *e, int fd);
  ~ServingFd();
  ServingFd(const ServingFd &) = delete;
  ServingFd &operator=(const ServingFd &) = delete;

 private:
  CacheEntry *e_;
  int fd_;
};

// Ids start at 1 and are never reused.
class CacheRegistry {
 public:
  std::shared_ptr<CacheEntry> Find(int64_t id) const;
  int64_t Add(std::shared_ptr<CacheEntry> e);      // assigns the id
  std::shared_ptr<CacheEntry> Take(int64_t id);    // removes; null when unknown
  std::map<int64_t, std::shared_ptr<CacheEntry>> TakeAll();
  std::vector<TableEntry> Describe() const;
  // Calls fn(caches) under the registry's shared lock (no entry is copied or retained).
  template <typename Fn>
  void Visit(Fn &&fn) const {
    std::shared_lock<std::shared_mutex> g(mu_);
    fn(caches_);
  }

 private:
  mutable std::shared_mutex mu_;
  std::map<int64_t, std::shared_ptr<CacheEntry>> caches_;
  int64_t next_id_ = 1;
};

// Marks a cache removed once every transfer using it has finished.
void RetireCache(CacheEntry *e);
// The same, but a serving thread still holding the cache at `deadline` (NowNs clock) has its
// channel shut down, so it lets go at once. Local transfers end by their own deadlines.
void RetireCache(CacheEntry *e, int64_t deadline);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_CACHE_CACHE_H_
