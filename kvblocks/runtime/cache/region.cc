// SPDX-License-Identifier: Apache-2.0
// Runtime-owned shared memory (memfd) and mappings of a same-host peer's.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstdio>

#include "cache/region.h"

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

}  // namespace kvblocks
