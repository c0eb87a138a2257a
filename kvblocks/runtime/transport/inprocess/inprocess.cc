// SPDX-License-Identifier: Apache-2.0
// In-process backend: memcpy between two engines of this process. Attaches only to a peer that
// proved it is an engine of this very process (the HMAC over the LINK_INFO bytes, transport/select.h).
#include "transport/backend.h"
#include "transport/peer.h"
#include "transport/select.h"

namespace kvblocks {

namespace {

class InProcess : public Backend {
 public:
  const char *name() const override { return "inprocess"; }
  uint64_t capability() const override { return 1 << 3; }  // its handshake bit (docs/protocol.md)
  const char *transport_option() const override { return "shm"; }
  bool Suits(const PeerLink &link) const override { return link.same_host; }
  PathMode path_mode() const override { return PathMode::kLocalCopy; }
  bool Offered(const BackendOptions &o) const override { return o.transport == "auto" || o.transport == "shm"; }
  bool Attach(PeerLink *link, std::shared_ptr<PeerState> *) override { return link->same_process; }
  std::shared_ptr<Path> PathFor(PeerLink *link, PeerState *, RemoteCache &rc) override {
    if (rc.addrs.empty()) return nullptr;
    std::vector<uint8_t *> view;
    for (uint64_t a : rc.addrs) view.push_back(reinterpret_cast<uint8_t *>(a));
    return Guarded(MakeMemoryPath("inprocess", std::move(view), nullptr), link, false);
  }
};

}  // namespace

Backend *InProcessBackend() {
  static InProcess b;
  return &b;
}

}  // namespace kvblocks
