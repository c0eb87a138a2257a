// SPDX-License-Identifier: Apache-2.0
// kvblocks: a host stand-in for the part of the Ascend runtime (acl/acl_rt.h) that CANN's
// LLM-DataDist and hixl samples use. Names, signatures, enum values and error codes follow CANN's
// public interface; the implementation is ours and serves "device" memory from host memory (as
// CachePlacement::kDevice and hixl's MEM_DEVICE are in kvblocks). Header-only and inline: include
// it, nothing to link. C++ only. Documented in docs/compat.md, "Ascend runtime stand-in".
#ifndef KVBLOCKS_ACL_ACL_RT_H_
#define KVBLOCKS_ACL_ACL_RT_H_

#ifndef __cplusplus
#error "kvblocks' acl/acl_rt.h stand-in is C++ only"
#endif

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "acl/acl_base.h"

typedef enum aclrtMemcpyKind {
  ACL_MEMCPY_HOST_TO_HOST,
  ACL_MEMCPY_HOST_TO_DEVICE,
  ACL_MEMCPY_DEVICE_TO_HOST,
  ACL_MEMCPY_DEVICE_TO_DEVICE,
  ACL_MEMCPY_DEFAULT,
  ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE,
  ACL_MEMCPY_INNER_DEVICE_TO_DEVICE,
  ACL_MEMCPY_INTER_DEVICE_TO_DEVICE,
} aclrtMemcpyKind;

typedef enum aclrtMemMallocPolicy {
  ACL_MEM_MALLOC_HUGE_FIRST,
  ACL_MEM_MALLOC_HUGE_ONLY,
  ACL_MEM_MALLOC_NORMAL_ONLY,
  ACL_MEM_MALLOC_HUGE_FIRST_P2P,
  ACL_MEM_MALLOC_HUGE_ONLY_P2P,
  ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
  ACL_MEM_MALLOC_HUGE1G_ONLY,
  ACL_MEM_MALLOC_HUGE1G_ONLY_P2P,
  ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x0100,
  ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000,
  ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000,
} aclrtMemMallocPolicy;

// Virtual memory management: types of aclrtMallocPhysical's properties.
typedef enum aclrtMemAttr {
  ACL_DDR_MEM,
  ACL_HBM_MEM,
  ACL_DDR_MEM_HUGE,
  ACL_DDR_MEM_NORMAL,
  ACL_HBM_MEM_HUGE,
  ACL_HBM_MEM_NORMAL,
  ACL_DDR_MEM_P2P_HUGE,
  ACL_DDR_MEM_P2P_NORMAL,
  ACL_HBM_MEM_P2P_HUGE,
  ACL_HBM_MEM_P2P_NORMAL,
  ACL_HBM_MEM_HUGE1G,
  ACL_HBM_MEM_P2P_HUGE1G,
  ACL_MEM_NORMAL,
  ACL_MEM_HUGE,
  ACL_MEM_HUGE1G,
  ACL_MEM_P2P_NORMAL,
  ACL_MEM_P2P_HUGE,
  ACL_MEM_P2P_HUGE1G,
} aclrtMemAttr;

typedef enum aclrtMemLocationType {
  ACL_MEM_LOCATION_TYPE_HOST = 0,
  ACL_MEM_LOCATION_TYPE_DEVICE,
  ACL_MEM_LOCATION_TYPE_UNREGISTERED,
  ACL_MEM_LOCATION_TYPE_MANAGED,
  ACL_MEM_LOCATION_TYPE_HOST_NUMA = 4,
} aclrtMemLocationType;

typedef struct aclrtMemLocation {
  uint32_t id;
  aclrtMemLocationType type;
} aclrtMemLocation;

typedef enum aclrtMemAllocationType { ACL_MEM_ALLOCATION_TYPE_PINNED = 0 } aclrtMemAllocationType;
typedef enum aclrtMemHandleType { ACL_MEM_HANDLE_TYPE_NONE = 0, ACL_MEM_HANDLE_TYPE_POSIX = 2 } aclrtMemHandleType;

typedef struct aclrtPhysicalMemProp {
  aclrtMemHandleType handleType;
  aclrtMemAllocationType allocationType;
  aclrtMemAttr memAttr;
  aclrtMemLocation location;
  uint64_t reserve;
} aclrtPhysicalMemProp;

typedef void *aclrtDrvMemHandle;

namespace kvblocks_acl {
// Process state of the stand-in. Everything is inline, so every translation unit shares one copy.
struct State {
  std::mutex mu;
  bool initialized = false;
  std::map<uintptr_t, size_t> reserved;  // aclrtReserveMemAddress: base -> size
  std::map<uintptr_t, size_t> mapped;    // aclrtMapMem: address -> size
};
inline State &GetState() {
  static State s;
  return s;
}
struct Physical {  // what an aclrtDrvMemHandle points to: a memfd of `size` bytes
  int fd;
  size_t size;
};
inline thread_local int current_device = -1;
inline thread_local std::string recent_error;
inline thread_local std::string returned_error;

// Records why the call failed (read by aclGetRecentErrMsg) and returns `code`.
inline aclError Fail(aclError code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
inline aclError Fail(aclError code, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  recent_error = buf;
  return code;
}
inline size_t PageSize() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : 4096U;
}
// The reservation holding [addr, addr + size), or reserved.end(). Caller holds mu.
inline std::map<uintptr_t, size_t>::iterator FindReservation(State &s, uintptr_t addr, size_t size) {
  auto it = s.reserved.upper_bound(addr);
  if (it == s.reserved.begin()) return s.reserved.end();
  --it;
  if (addr - it->first > it->second || size > it->second - (addr - it->first)) return s.reserved.end();
  return it;
}
}  // namespace kvblocks_acl

// ---- process and device ----
// aclInit: once per process (again: ACL_ERROR_REPEAT_INITIALIZE). configPath is ignored.
inline aclError aclInit(const char *configPath) {
  (void)configPath;
  auto &s = kvblocks_acl::GetState();
  std::lock_guard<std::mutex> g(s.mu);
  if (s.initialized) return kvblocks_acl::Fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit: already initialized");
  s.initialized = true;
  return ACL_SUCCESS;
}
inline aclError aclFinalize() {
  auto &s = kvblocks_acl::GetState();
  std::lock_guard<std::mutex> g(s.mu);
  if (!s.initialized) return kvblocks_acl::Fail(ACL_ERROR_REPEAT_FINALIZE, "aclFinalize: not initialized");
  s.initialized = false;
  return ACL_SUCCESS;
}
// Any device id >= 0 exists; the calling thread's current device is remembered.
inline aclError aclrtSetDevice(int32_t deviceId) {
  if (deviceId < 0) return kvblocks_acl::Fail(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice: device %d", deviceId);
  kvblocks_acl::current_device = deviceId;
  return ACL_SUCCESS;
}
inline aclError aclrtResetDevice(int32_t deviceId) {
  if (deviceId < 0) return kvblocks_acl::Fail(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtResetDevice: device %d", deviceId);
  if (kvblocks_acl::current_device == deviceId) kvblocks_acl::current_device = -1;
  return ACL_SUCCESS;
}
inline aclError aclrtGetDevice(int32_t *deviceId) {
  if (deviceId == nullptr) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is null");
  if (kvblocks_acl::current_device < 0)
    return kvblocks_acl::Fail(ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetDevice: no aclrtSetDevice on this thread");
  *deviceId = kvblocks_acl::current_device;
  return ACL_SUCCESS;
}
// The reason for the calling thread's most recent failed call, or nullptr; reading clears it. The
// text stays valid until the next aclGetRecentErrMsg on this thread.
inline const char *aclGetRecentErrMsg() {
  if (kvblocks_acl::recent_error.empty()) return nullptr;
  kvblocks_acl::returned_error.swap(kvblocks_acl::recent_error);
  kvblocks_acl::recent_error.clear();
  return kvblocks_acl::returned_error.c_str();
}

// ---- memory: device memory is page-aligned host memory ----
inline aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
  (void)policy;
  if (devPtr == nullptr || size == 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMalloc: devPtr is null or size is 0");
  void *p = nullptr;
  if (posix_memalign(&p, kvblocks_acl::PageSize(), size) != 0)
    return kvblocks_acl::Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMalloc: out of memory (%zu bytes)", size);
  *devPtr = p;
  return ACL_SUCCESS;
}
inline aclError aclrtFree(void *devPtr) {
  if (devPtr == nullptr) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: devPtr is null");
  std::free(devPtr);
  return ACL_SUCCESS;
}
inline aclError aclrtMallocHost(void **hostPtr, size_t size) {
  if (hostPtr == nullptr || size == 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocHost: hostPtr is null or size is 0");
  void *p = nullptr;
  if (posix_memalign(&p, kvblocks_acl::PageSize(), size) != 0)
    return kvblocks_acl::Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocHost: out of memory (%zu bytes)", size);
  *hostPtr = p;
  return ACL_SUCCESS;
}
inline aclError aclrtFreeHost(void *hostPtr) {
  if (hostPtr == nullptr) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is null");
  std::free(hostPtr);
  return ACL_SUCCESS;
}
// Every kind is a host memmove of `count` bytes; count > destMax is refused, nothing copied.
inline aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
  if (static_cast<int>(kind) < ACL_MEMCPY_HOST_TO_HOST || static_cast<int>(kind) > ACL_MEMCPY_INTER_DEVICE_TO_DEVICE)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy: kind %d is unknown", static_cast<int>(kind));
  if (count > destMax)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy: count %zu exceeds destMax %zu", count, destMax);
  if (count == 0U) return ACL_SUCCESS;
  if (dst == nullptr || src == nullptr) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpy: null pointer");
  std::memmove(dst, src, count);
  return ACL_SUCCESS;
}
// Sets `count` bytes to `value`; count > maxCount is refused, nothing written.
inline aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
  if (count > maxCount)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: count %zu exceeds maxCount %zu", count, maxCount);
  if (count == 0U) return ACL_SUCCESS;
  if (devPtr == nullptr) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: devPtr is null");
  std::memset(devPtr, value, count);
  return ACL_SUCCESS;
}

// ---- virtual memory management: a reserved range is PROT_NONE address space, physical memory is
// a memfd, and aclrtMapMem maps (part of) one into the other, so the bytes are reachable there ----
inline aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags) {
  (void)flags;
  if (virPtr == nullptr || size == 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtReserveMemAddress: virPtr is null or size is 0");
  if (alignment != 0U && (alignment & (alignment - 1U)) != 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtReserveMemAddress: alignment %zu is not a power of 2",
                              alignment);
  const size_t page = kvblocks_acl::PageSize();
  const size_t align = alignment > page ? alignment : page;
  const size_t span = size + align;
  void *raw = mmap(expectPtr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED)
    return kvblocks_acl::Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtReserveMemAddress: cannot reserve %zu bytes", size);
  const uintptr_t base = (reinterpret_cast<uintptr_t>(raw) + align - 1U) & ~(uintptr_t{align} - 1U);
  const size_t len = (size + page - 1U) / page * page;
  if (base > reinterpret_cast<uintptr_t>(raw)) munmap(raw, base - reinterpret_cast<uintptr_t>(raw));
  const uintptr_t end = reinterpret_cast<uintptr_t>(raw) + span;
  if (end > base + len) munmap(reinterpret_cast<void *>(base + len), end - (base + len));
  auto &s = kvblocks_acl::GetState();
  std::lock_guard<std::mutex> g(s.mu);
  s.reserved[base] = len;
  *virPtr = reinterpret_cast<void *>(base);
  return ACL_SUCCESS;
}
// Releases a whole reservation (and whatever is still mapped in it).
inline aclError aclrtReleaseMemAddress(void *virPtr) {
  auto &s = kvblocks_acl::GetState();
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.reserved.find(reinterpret_cast<uintptr_t>(virPtr));
  if (it == s.reserved.end())
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtReleaseMemAddress: %p was not reserved", virPtr);
  munmap(virPtr, it->second);
  for (auto m = s.mapped.lower_bound(it->first); m != s.mapped.end() && m->first < it->first + it->second;)
    m = s.mapped.erase(m);
  s.reserved.erase(it);
  return ACL_SUCCESS;
}
inline aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                                    uint64_t flags) {
  (void)flags;
  if (handle == nullptr || prop == nullptr || size == 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMallocPhysical: null handle or prop, or size 0");
  const int fd = memfd_create("kvblocks-acl-physical", MFD_CLOEXEC);
  if (fd < 0) return kvblocks_acl::Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocPhysical: memfd_create failed");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return kvblocks_acl::Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMallocPhysical: cannot size %zu bytes", size);
  }
  *handle = new kvblocks_acl::Physical{fd, size};
  return ACL_SUCCESS;
}
// Frees the handle; ranges still mapped keep their bytes until aclrtUnmapMem.
inline aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
  if (handle == nullptr) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtFreePhysical: handle is null");
  auto *p = static_cast<kvblocks_acl::Physical *>(handle);
  close(p->fd);
  delete p;
  return ACL_SUCCESS;
}
// Maps bytes [offset, offset + size) of `handle` at virPtr, which must lie in a reservation.
inline aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags) {
  (void)flags;
  if (virPtr == nullptr || handle == nullptr || size == 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMapMem: null virPtr or handle, or size 0");
  const auto *p = static_cast<const kvblocks_acl::Physical *>(handle);
  const size_t page = kvblocks_acl::PageSize();
  if (offset > p->size || size > p->size - offset || offset % page != 0U ||
      reinterpret_cast<uintptr_t>(virPtr) % page != 0U)
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM,
                              "aclrtMapMem: offset %zu + size %zu outside the %zu physical bytes, or unaligned", offset,
                              size, p->size);
  auto &s = kvblocks_acl::GetState();
  std::lock_guard<std::mutex> g(s.mu);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(virPtr);
  if (kvblocks_acl::FindReservation(s, addr, size) == s.reserved.end())
    return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtMapMem: [%p, +%zu) is not in a reserved range", virPtr, size);
  if (mmap(virPtr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, static_cast<off_t>(offset)) == MAP_FAILED)
    return kvblocks_acl::Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMapMem: mmap failed");
  s.mapped[addr] = size;
  return ACL_SUCCESS;
}
// Unmaps what aclrtMapMem mapped at virPtr; the range stays reserved.
inline aclError aclrtUnmapMem(void *virPtr) {
  auto &s = kvblocks_acl::GetState();
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.mapped.find(reinterpret_cast<uintptr_t>(virPtr));
  if (it == s.mapped.end()) return kvblocks_acl::Fail(ACL_ERROR_INVALID_PARAM, "aclrtUnmapMem: %p is not mapped", virPtr);
  mmap(virPtr, it->second, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  s.mapped.erase(it);
  return ACL_SUCCESS;
}

#endif  // KVBLOCKS_ACL_ACL_RT_H_
