// SPDX-License-Identifier: Apache-2.0
// The C interface between the runtime and the UCX plugin (libkvblocks_ucx.so, built by the
// kvblocks-ucx companion package in ucx/). The runtime dlopen()s the plugin on first need, so
// neither `import kvblocks` nor the base build depends on UCX. Plain C: the plugin may be built
// against another UCX (a system one with verbs) by another compiler.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_UCX_ABI_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_UCX_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVB_UCX_ABI_VERSION 3

typedef struct kvb_ucx_ctx kvb_ucx_ctx;  // UCP context + one worker + its progress thread
typedef struct kvb_ucx_mem kvb_ucx_mem;  // a ucp_mem_map'ed range
typedef struct kvb_ucx_ep kvb_ucx_ep;    // an endpoint to one peer's worker
typedef struct kvb_ucx_rkey kvb_ucx_rkey;

typedef struct {
  uint64_t local, remote, len;  // addresses in this and in the peer's process
  uint32_t rkey;                // index into the rkeys passed to run()
  uint32_t lmem;                // index into the local mappings passed to run(); KVB_UCX_NO_MEM: none
} kvb_ucx_op;

#define KVB_UCX_NO_MEM 0xffffffffu

enum { KVB_UCX_OK = 0, KVB_UCX_TIMEOUT = 1, KVB_UCX_FAILED = 2, KVB_UCX_ABORTED = 3 };

typedef struct {
  uint32_t abi;                  // KVB_UCX_ABI_VERSION
  const char *(*version)(void);  // the loaded UCP library's version
  // `net_devices`: UCX_NET_DEVICES for the worker (the only interfaces it listens on), whatever the
  // environment says.
  kvb_ucx_ctx *(*create)(const char *net_devices, char *err, size_t errlen);
  void (*destroy)(kvb_ucx_ctx *ctx);
  // The worker address; returns its length (copied when <= cap).
  size_t (*address)(kvb_ucx_ctx *ctx, void *buf, size_t cap);
  kvb_ucx_mem *(*mem_map)(kvb_ucx_ctx *ctx, void *addr, size_t len, char *err, size_t errlen);
  size_t (*mem_rkey)(kvb_ucx_mem *mem, void *buf, size_t cap);  // the packed rkey, as address()
  void (*mem_unmap)(kvb_ucx_mem *mem);
  kvb_ucx_ep *(*connect)(kvb_ucx_ctx *ctx, const void *addr, size_t len, char *err, size_t errlen);
  kvb_ucx_rkey *(*rkey_unpack)(kvb_ucx_ep *ep, const void *buf, size_t len);
  void (*rkey_destroy)(kvb_ucx_rkey *rkey);
  // Posts every op (get when `get`, else put), one flush, and waits for it until deadline_ns
  // (CLOCK_MONOTONIC). `keep_going(arg)` is polled while waiting; 0 aborts. On any outcome but
  // KVB_UCX_OK the endpoint is force-closed before returning: no op of this or any other call on it
  // touches local memory afterwards.
  // `lmems`: the local mappings the ops' local ranges lie in (UCX then skips its own lookup).
  int (*run)(kvb_ucx_ep *ep, kvb_ucx_rkey *const *rkeys, size_t nrkeys, kvb_ucx_mem *const *lmems, size_t nlmems,
             const kvb_ucx_op *ops, size_t n, int get, int64_t deadline_ns, int (*keep_going)(void *), void *arg,
             char *err, size_t errlen);
  void (*close)(kvb_ucx_ep *ep);  // force-closes (if still open) and frees
} kvb_ucx_api;

typedef const kvb_ucx_api *(*kvb_ucx_entry_fn)(void);
#define KVB_UCX_ENTRY "kvblocks_ucx_api"

#ifdef __cplusplus
}
#endif

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_UCX_ABI_H_
