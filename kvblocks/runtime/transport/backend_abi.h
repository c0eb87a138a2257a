// SPDX-License-Identifier: Apache-2.0
// The C interface between the runtime and a backend plugin: a shared library shipped by a companion
// package (the network RMA one, built from a folder of this repository, is the first; a GPU one
// ships the same way). The runtime dlopen()s a plugin on first need (transport/plugin.h), so
// neither `import kvblocks` nor the base build depends on it. Plain C: a plugin may be built against
// another library version by another compiler. A plugin of another ABI version, or another backend than the one asked for, is refused.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_ABI_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 4: the first plugin's ABI (3) made general: the backend's name, the memory kinds it maps, and a
// memory kind and device in mem_map.
#define KVB_BACKEND_ABI_VERSION 4

// Memory kinds (common/mem_kind.h MemKind): mem_map's `kind`, and bits (1 << kind) of `mem_kinds`.
#define KVB_MEM_HOST 0u
#define KVB_MEM_CUDA 1u

typedef struct kvb_ctx kvb_ctx;  // the backend's context (e.g. a network context, one worker, its progress thread)
typedef struct kvb_mem kvb_mem;  // a registered range (a memory map)
typedef struct kvb_ep kvb_ep;    // an endpoint to one peer's context
typedef struct kvb_rkey kvb_rkey;

typedef struct {
  uint64_t local, remote, len;  // addresses in this and in the peer's process
  uint32_t rkey;                // index into the rkeys passed to run()
  uint32_t lmem;                // index into the local mappings passed to run(); KVB_NO_MEM: none
} kvb_op;

#define KVB_NO_MEM 0xffffffffu

enum { KVB_OK = 0, KVB_TIMEOUT = 1, KVB_FAILED = 2, KVB_ABORTED = 3 };

typedef struct {
  uint32_t abi;                  // KVB_BACKEND_ABI_VERSION
  const char *name;              // the backend it implements (its Backend::name()); the runtime checks it
  uint32_t mem_kinds;            // bit (1 << KVB_MEM_*) per memory kind mem_map accepts
  const char *(*version)(void);  // the loaded library's version (e.g. the network library's)
  // `net_devices`: the interfaces the context may listen on (e.g. its worker's device list),
  // whatever the environment says.
  kvb_ctx *(*create)(const char *net_devices, char *err, size_t errlen);
  void (*destroy)(kvb_ctx *ctx);
  // The worker address; returns its length (copied when <= cap).
  size_t (*address)(kvb_ctx *ctx, void *buf, size_t cap);
  // `kind`: KVB_MEM_*; `device`: its ordinal (-1 for host memory). A kind outside mem_kinds fails.
  kvb_mem *(*mem_map)(kvb_ctx *ctx, void *addr, size_t len, uint32_t kind, int32_t device, char *err, size_t errlen);
  size_t (*mem_rkey)(kvb_mem *mem, void *buf, size_t cap);  // the packed rkey, as address()
  void (*mem_unmap)(kvb_mem *mem);
  kvb_ep *(*connect)(kvb_ctx *ctx, const void *addr, size_t len, char *err, size_t errlen);
  kvb_rkey *(*rkey_unpack)(kvb_ep *ep, const void *buf, size_t len);
  void (*rkey_destroy)(kvb_rkey *rkey);
  // Posts every op (get when `get`, else put) and waits for them until deadline_ns (CLOCK_MONOTONIC);
  // a put call then makes its writes remote-complete (e.g. by a flush) within the same deadline.
  // `keep_going(arg)` is polled while waiting; 0 aborts. Whatever the outcome, when it returns no op
  // of this or any other call on `ep` touches local memory afterwards (how is the backend's affair:
  // e.g. force-closing an endpoint with ops in flight, parking one whose flush alone timed out).
  // `lmems`: the local mappings the ops' local ranges lie in (the backend then skips its own lookup).
  int (*run)(kvb_ep *ep, kvb_rkey *const *rkeys, size_t nrkeys, kvb_mem *const *lmems, size_t nlmems,
             const kvb_op *ops, size_t n, int get, int64_t deadline_ns, int (*keep_going)(void *), void *arg,
             char *err, size_t errlen);
  void (*close)(kvb_ep *ep);  // force-closes (if still open) and frees
} kvb_backend_api;

typedef const kvb_backend_api *(*kvb_backend_entry_fn)(void);
#define KVB_BACKEND_ENTRY "kvblocks_backend_api"

#ifdef __cplusplus
}
#endif

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_ABI_H_
