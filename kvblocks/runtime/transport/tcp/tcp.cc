// SPDX-License-Identifier: Apache-2.0
// TCP backend: requests over the link's data channels, served by the peer from its own table
// (tcp/tcp_serve.cc). Every peer offers it: the fallback of every selection. Its state on a link is
// the pool of those channels (tcp/channels.h).
#include "transport/backend.h"
#include "transport/peer.h"
#include "transport/tcp/channels.h"
#include "transport/tcp/tcp_path.h"

namespace kvblocks {

namespace {

class Tcp : public Backend {
 public:
  const char *name() const override { return "tcp"; }
  uint64_t capability() const override { return 1 << 0; }  // its handshake bit (docs/protocol.md)
  const char *transport_option() const override { return "tcp"; }
  PathMode path_mode() const override { return PathMode::kServed; }
  bool Offered(const BackendOptions &) const override { return true; }
  bool Attach(PeerLink *link, std::shared_ptr<PeerState> *state) override {
    *state = std::make_shared<TcpChannels>(link);
    return true;
  }
  std::shared_ptr<Path> PathFor(PeerLink *link, PeerState *state, RemoteCache &rc) override {
    if (state == nullptr) return nullptr;
    return MakeTcpPath(link, static_cast<TcpChannels *>(state)->shared_from_this(), rc.id);
  }
};

}  // namespace

Backend *TcpBackend() {
  static Tcp b;
  return &b;
}

}  // namespace kvblocks
