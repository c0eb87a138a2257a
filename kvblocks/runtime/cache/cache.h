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

#include "common/mem_kind.h"
#include "transport/memory.h"
#include "wire/table.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

// One of this engine's caches: the registered memory paths see (transport/memory.h), and the
// engine's bookkeeping of it.
struct CacheEntry : LocalMemory {
  CacheKind kind = CacheKind::kMix;
  int64_t key = -1;
  llm_datadist::CacheDesc desc;
  uint64_t num_blocks = 0;  // 0 for kCache
  uint64_t batch_size = 0;
  std::vector<int64_t> batch_keys;       // kvblocks extension: a key per batch index (table.h)
  bool free_when_unbound = false;        // deallocate deferred until the last batch key is released
  std::mutex remove_mu;  // one unregister of this cache at a time

  TableEntry Describe() const;  // the entry peers see in the link-time table (every backend's part)
};

// Holds a cache for the duration of a transfer (transport/memory.h MemoryUse).
using CacheUse = MemoryUse;

// Ids start at 1 and are never reused.
class CacheRegistry : public LocalTable {
 public:
  std::shared_ptr<CacheEntry> Find(int64_t id) const;
  std::shared_ptr<LocalMemory> FindMemory(int64_t id) const override { return Find(id); }
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
