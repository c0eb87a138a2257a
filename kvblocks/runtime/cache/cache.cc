// SPDX-License-Identifier: Apache-2.0
#include "cache/cache.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "common/util.h"
#include "transport/registry.h"

namespace kvblocks {

TableEntry CacheEntry::Describe() const {
  TableEntry t;
  t.id = id;
  t.kind = kind;
  t.key = key;
  t.num_tensors = num_tensors;
  t.tensor_bytes = tensor_bytes;
  t.num_blocks = num_blocks;
  t.batch_size = batch_size;
  t.stride = stride;
  t.mem = mem;
  t.addrs = addrs;  // also hixl's address ranges (engine/ranges.cc), whatever reaches the cache
  t.batch_keys = batch_keys;
  DescribeEverywhere(*this, &t);
  return t;
}

std::shared_ptr<CacheEntry> CacheRegistry::Find(int64_t id) const {
  std::shared_lock<std::shared_mutex> g(mu_);
  auto it = caches_.find(id);
  return it == caches_.end() ? nullptr : it->second;
}

int64_t CacheRegistry::Add(std::shared_ptr<CacheEntry> e) {
  std::unique_lock<std::shared_mutex> g(mu_);
  e->id = next_id_++;
  caches_[e->id] = std::move(e);
  return next_id_ - 1;
}

std::shared_ptr<CacheEntry> CacheRegistry::Take(int64_t id) {
  std::unique_lock<std::shared_mutex> g(mu_);
  auto it = caches_.find(id);
  if (it == caches_.end()) return nullptr;
  auto e = std::move(it->second);
  caches_.erase(it);
  return e;
}

std::map<int64_t, std::shared_ptr<CacheEntry>> CacheRegistry::TakeAll() {
  std::unique_lock<std::shared_mutex> g(mu_);
  std::map<int64_t, std::shared_ptr<CacheEntry>> all;
  all.swap(caches_);
  return all;
}

std::vector<TableEntry> CacheRegistry::Describe() const {
  std::shared_lock<std::shared_mutex> g(mu_);
  std::vector<TableEntry> out;
  out.reserve(caches_.size());
  for (const auto &kv : caches_)
    if (!kv.second->closing.load()) out.push_back(kv.second->Describe());
  return out;
}

void RetireCache(CacheEntry *e) {
  std::unique_lock<std::shared_timed_mutex> use(e->use_mu);
  e->removed = true;
}

void RetireCache(CacheEntry *e, int64_t deadline) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::max<int64_t>(deadline - NowNs(), 0));
  std::unique_lock<std::shared_timed_mutex> use(e->use_mu, until);
  if (!use.owns_lock()) {
    {
      std::lock_guard<std::mutex> g(e->serving_mu);
      for (int fd : e->serving_fds) shutdown(fd, SHUT_RDWR);
    }
    use.lock();
  }
  e->removed = true;
}

}  // namespace kvblocks
