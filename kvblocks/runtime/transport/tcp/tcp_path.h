// SPDX-License-Identifier: Apache-2.0
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_TCP_TCP_PATH_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_TCP_TCP_PATH_H_

#include <cstdint>
#include <memory>

#include "transport/backend.h"
#include "transport/path.h"

namespace kvblocks {

// Requests over the link's data channels (`channels`, the link's pool), served by the peer
// (tcp/tcp_serve.cc).
std::unique_ptr<Path> MakeTcpPath(PeerLink *link, std::shared_ptr<RequestChannels> channels, int64_t remote_cache_id);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_TCP_TCP_PATH_H_
