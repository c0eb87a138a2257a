// SPDX-License-Identifier: Apache-2.0
// Cross-memory-attach backend: process_vm_readv/writev on a same-host peer's registered memory, by
// the pid the kernel reported in the local exchange, once ptrace permission on it is proven.
#include <sys/uio.h>

#include "transport/backend.h"
#include "transport/cma/cma_path.h"
#include "transport/peer.h"
#include "transport/select.h"

namespace kvblocks {

namespace {

// Cross-memory attach needs ptrace permission on the peer; probe it on a known cookie. `pid` is the
// kernel's (SO_PEERCRED); the cookie's address is the peer's word, harmless to read in its own memory.
bool CanAttach(int pid, const PeerIdentity &peer) {
  uint64_t got = 0;
  iovec l{&got, sizeof(got)};
  iovec r{reinterpret_cast<void *>(peer.probe_addr), sizeof(got)};
  return process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0) == sizeof(got) && got == peer.probe_value;
}

class Cma : public Backend {
 public:
  const char *name() const override { return "cma"; }
  uint64_t capability() const override { return 1 << 2; }  // its handshake bit (docs/protocol.md)
  const char *transport_option() const override { return "shm"; }
  bool NeedsLocalExchange() const override { return true; }
  bool Suits(const PeerLink &link) const override { return link.same_host; }
  PathMode path_mode() const override { return PathMode::kLocalCopy; }
  bool Offered(const BackendOptions &o) const override { return o.transport == "auto" || o.transport == "shm"; }
  bool Attach(PeerLink *link, std::shared_ptr<PeerState> *) override {
    return !link->same_process && link->local.pid > 0 && CanAttach(link->local.pid, link->peer);
  }
  std::shared_ptr<Path> PathFor(PeerLink *link, PeerState *, RemoteCache &rc) override {
    if (rc.addrs.empty()) return nullptr;
    return Guarded(MakeCmaPath(link->local.pid, rc.addrs), link, true);
  }
};

}  // namespace

Backend *CmaBackend() {
  static Cma b;
  return &b;
}

}  // namespace kvblocks
