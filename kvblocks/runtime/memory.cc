// SPDX-License-Identifier: Apache-2.0
// Runtime-owned shared memory and the cache table exchanged at link time.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstdio>

#include "runtime.h"

namespace kvblocks {

namespace {
// Prefaulting spares the first transfer its page faults, but only when the pages surely fit:
// populating more than the free memory would get the process OOM-killed instead of failing.
int PopulateFlag(size_t size) {
  struct sysinfo si;
  if (sysinfo(&si) != 0) return 0;
  const unsigned long long free_bytes = static_cast<unsigned long long>(si.freeram) * si.mem_unit;
  return size <= free_bytes / 2 ? MAP_POPULATE : 0;
}

bool FitsInMemory(size_t size) {
  struct sysinfo si;
  if (sysinfo(&si) != 0) return true;
  const unsigned long long total = (static_cast<unsigned long long>(si.totalram) + si.totalswap) * si.mem_unit;
  return size <= total;
}
}  // namespace

SharedRegion::~SharedRegion() {
  if (base != nullptr) munmap(base, size);
  if (fd >= 0) close(fd);
}

std::shared_ptr<SharedRegion> SharedRegion::Create(size_t size) {
  if (!FitsInMemory(size)) return nullptr;  // LLM_*OUT_OF_MEMORY rather than a later OOM kill
  const int fd = memfd_create("kvblocks-cache", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto r = std::make_shared<SharedRegion>();
  r->fd = fd;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return nullptr;
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | PopulateFlag(size), fd, 0);
  if (p == MAP_FAILED) return nullptr;
  r->base = static_cast<uint8_t *>(p);
  r->size = size;
  struct stat st;
  if (fstat(fd, &st) != 0) return nullptr;
  r->ino = st.st_ino;
  r->dev = st.st_dev;
  return r;
}

std::shared_ptr<SharedRegion> SharedRegion::MapPeer(int pid, int fd, uint64_t ino, uint64_t dev, size_t size) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
  const int local = open(path, O_RDWR | O_CLOEXEC);
  if (local < 0) return nullptr;
  auto r = std::make_shared<SharedRegion>();
  r->fd = local;
  struct stat st;
  if (fstat(local, &st) != 0 || st.st_ino != ino || st.st_dev != dev || static_cast<uint64_t>(st.st_size) < size)
    return nullptr;
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | PopulateFlag(size), local, 0);
  if (p == MAP_FAILED) return nullptr;
  r->base = static_cast<uint8_t *>(p);
  r->size = size;
  r->ino = ino;
  r->dev = dev;
  return r;
}

void SerializeCacheTable(const std::vector<std::shared_ptr<CacheEntry>> &caches, std::string *out) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(caches.size()));
  for (const auto &c : caches) {
    w.Put<int64_t>(c->id);
    w.Put<uint8_t>(static_cast<uint8_t>(c->kind));
    w.Put<int64_t>(c->key);
    w.Put<uint32_t>(c->num_tensors);
    w.Put<uint64_t>(c->tensor_bytes);
    w.Put<uint64_t>(c->num_blocks);
    w.Put<uint64_t>(c->batch_size);
    w.Put<uint64_t>(c->stride);
    const bool shm = c->region != nullptr;
    w.Put<int32_t>(shm ? c->region->fd : -1);
    w.Put<uint64_t>(shm ? c->region->ino : 0);
    w.Put<uint64_t>(shm ? c->region->dev : 0);
    w.Put<uint64_t>(shm ? c->region->size : 0);
    w.Put<uint64_t>(c->pitch);
    for (uint64_t a : c->addrs) w.Put<uint64_t>(a);
  }
  *out = std::move(w.buf);
}

bool ParseCacheTable(const uint8_t *p, size_t n, std::map<int64_t, RemoteCache> *out) {
  Reader r{p, n};
  const uint32_t count = r.Get<uint32_t>();
  if (!r.ok || count > (1U << 20)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    RemoteCache c;
    c.id = r.Get<int64_t>();
    const uint8_t kind = r.Get<uint8_t>();
    c.kind = static_cast<CacheKind>(kind);
    c.key = r.Get<int64_t>();
    c.num_tensors = r.Get<uint32_t>();
    c.tensor_bytes = r.Get<uint64_t>();
    c.num_blocks = r.Get<uint64_t>();
    c.batch_size = r.Get<uint64_t>();
    c.stride = r.Get<uint64_t>();
    c.peer_fd = r.Get<int32_t>();
    c.ino = r.Get<uint64_t>();
    c.dev = r.Get<uint64_t>();
    c.region_size = r.Get<uint64_t>();
    c.pitch = r.Get<uint64_t>();
    if (!r.ok || kind > 2 || c.num_tensors == 0 || c.num_tensors > (1U << 20)) return false;
    // The table drives one-sided copies into mapped memory: it must be self-consistent.
    uint64_t span;
    if (c.tensor_bytes == 0 || c.stride == 0 || __builtin_mul_overflow(c.num_blocks, c.stride, &span) ||
        span > c.tensor_bytes || __builtin_mul_overflow(c.batch_size, c.stride, &span) || span > c.tensor_bytes)
      return false;
    if (c.peer_fd >= 0) {
      uint64_t last, end;
      if (c.pitch < c.tensor_bytes || __builtin_mul_overflow(c.pitch, uint64_t{c.num_tensors - 1}, &last) ||
          __builtin_add_overflow(last, c.tensor_bytes, &end) || end > c.region_size)
        return false;
    }
    c.addrs.resize(c.num_tensors);
    for (auto &a : c.addrs) a = r.Get<uint64_t>();
    if (!r.ok) return false;
    (*out)[c.id] = std::move(c);
  }
  return r.off == n;
}

}  // namespace kvblocks
