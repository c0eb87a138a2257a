// SPDX-License-Identifier: Apache-2.0
// The UCX backend, runtime side: loads the plugin (transport/backend_abi.h) on first need, owns one
// UCP worker per engine, registers caches with it and reaches a peer's caches with get/put on their
// rkeys, learned from the peer's UCX_INFO after CONFIRM (ucx_info.h). Only ucx_path.cc uses this header.
// UCX's software RMA serves any address to whoever reaches the worker, so all of this runs only
// under kvblocks.UcxTrustedNetwork=1, with the worker on one interface (README, threat model).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_UCX_PATH_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_UCX_PATH_H_

#include <memory>
#include <string>

namespace kvblocks {

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

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_UCX_PATH_H_
