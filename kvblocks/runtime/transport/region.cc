// SPDX-License-Identifier: Apache-2.0
// Runtime-owned shared memory (memfd) and mappings of a same-host peer's.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstdio>

#include "transport/region.h"

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
  const int fd = memfd_create("kvblocks-cache", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  auto r = std::make_shared<SharedRegion>();
  r->fd = fd;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return nullptr;
  // Sealed at its size: a peer that maps it can rely on every page staying there (no SIGBUS).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return nullptr;
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

std::shared_ptr<SharedRegion> SharedRegion::MapReceived(int fd, size_t size) {
  auto r = std::make_shared<SharedRegion>();
  r->fd = fd;  // owned from here on
  struct stat st;
  // Only a memfd sealed against shrinking: a peer truncating it later must not SIGBUS us.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < size || size == 0)
    return nullptr;
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | PopulateFlag(size), fd, 0);
  if (p == MAP_FAILED) return nullptr;
  r->base = static_cast<uint8_t *>(p);
  r->size = size;
  r->ino = st.st_ino;
  r->dev = st.st_dev;
  return r;
}

}  // namespace kvblocks
