// SPDX-License-Identifier: Apache-2.0
// The UCX transport, runtime side: loads the plugin (ucx_abi.h) on first need, owns one UCP worker
// per engine, registers caches with it and reaches a peer's caches with get/put on their rkeys.
// UCX's software RMA serves any address to whoever reaches the worker, so all of this runs only
// under kvblocks.UcxTrustedNetwork=1, with the worker on one interface (README, threat model).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_UCX_PATH_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_UCX_PATH_H_

#include <memory>
#include <string>

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct Link;
struct CacheEntry;
struct TableEntry;
class UcxContext;

// The plugin, loaded once per process (one log line either way); false when it cannot be loaded,
// with the reason in *why.
bool UcxAvailable(std::string *why = nullptr);

// The UCX_NET_DEVICES that keep a worker on the interface of `fd`'s local address (a link's control
// connection): that interface, and the RDMA ports of its device. Empty, with the reason in *why,
// when no interface carries that address.
std::string UcxDevicesOf(int fd, std::string *why);

// One engine's UCP context and worker (with the thread that progresses it), listening only on
// `devices`. Null, with the reason in *why, when UCX is unavailable or its set-up fails.
std::shared_ptr<UcxContext> MakeUcxContext(const std::string &devices, std::string *why);

// Registers `cache` with the worker (once; the registration lives as long as the cache, or until
// UcxForget) and adds its UCX descriptor (worker address, rkeys) to `entry`, for UCX_INFO only.
void UcxAnnounce(const std::shared_ptr<UcxContext> &ctx, CacheEntry *cache, TableEntry *entry);

// Gives the link's caches the descriptors of the peer's UCX_INFO. False (nothing taken) when one
// names a cache the link-time table lacks, or does not match its tensors.
bool UcxTake(const struct UcxInfo &info, Link *link);

// Connects to the peer's worker and attaches the UCX backend to the link (AttachLater): every
// remote cache with a UCX descriptor gets a UCX path, all of them when `force`, else those still
// on a served path. Returns false (and why) when
// no endpoint could be made.
bool UcxAttach(const std::shared_ptr<UcxContext> &ctx, Link *link, bool force, std::string *why);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_UCX_PATH_H_
