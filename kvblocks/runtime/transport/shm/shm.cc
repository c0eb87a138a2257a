// SPDX-License-Identifier: Apache-2.0
// Shared-memory backend: memcpy into a same-host peer's allocated cache (a memfd it sent over the
// kernel-verified local exchange, transport/local_peer.h), mapped here.
#include "transport/memory.h"
#include "transport/backend.h"
#include "transport/peer.h"
#include "transport/select.h"

namespace kvblocks {

namespace {

class Shm : public Backend {
 public:
  const char *name() const override { return "shm"; }
  uint64_t capability() const override { return 1 << 1; }  // its handshake bit (docs/protocol.md)
  const char *transport_option() const override { return "shm"; }
  bool NeedsLocalExchange() const override { return true; }
  // Transport=shm: a verified same-host peer, whichever same-host backend reaches it.
  bool Suits(const PeerLink &link) const override { return link.same_host; }
  PathMode path_mode() const override { return PathMode::kLocalCopy; }
  bool Offered(const BackendOptions &o) const override { return o.transport == "auto" || o.transport == "shm"; }
  void Describe(const LocalMemory &e, TableEntry *t) const override {
    if (!e.region) return;
    t->has_memfd = true;
    t->memfd = MemfdDesc{e.region->fd, e.region->ino, e.region->dev, e.region->size, e.pitch};
  }
  bool Attach(PeerLink *link, std::shared_ptr<PeerState> *) override {
    return !link->same_process && link->local.pid > 0;
  }
  std::shared_ptr<Path> PathFor(PeerLink *link, PeerState *, RemoteCache &rc) override {
    auto fd = link->local.memfds.find(rc.id);
    if (!rc.has_memfd || fd == link->local.memfds.end()) return nullptr;
    // Every tensor lies inside region_size (DecodeTable), and the received memfd is at least that
    // long and sealed against shrinking: no copy can leave the mapping.
    auto mapped = SharedRegion::MapReceived(fd->second, rc.memfd.region_size);
    fd->second = -1;  // owned by `mapped` now
    if (!mapped) return nullptr;
    std::vector<uint8_t *> view;
    for (uint32_t i = 0; i < rc.num_tensors; ++i) view.push_back(mapped->base + i * rc.memfd.pitch);
    return Guarded(MakeMemoryPath("shm", std::move(view), std::move(mapped)), link, false);
  }
};

}  // namespace

Backend *ShmBackend() {
  static Shm b;
  return &b;
}

}  // namespace kvblocks
