// SPDX-License-Identifier: Apache-2.0
// A backend is a transport's whole life: the memory kinds it serves, its part in registering a
// cache and in the cache table, attaching to a peer from what the handshake verified, the Path it
// gives each remote cache, and teardown. Each lives in transport/<name>/ and keeps its state there
// (per cache, per peer); transport/registry.cc lists them in order of preference.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/mem_kind.h"
#include "transport/path.h"

namespace kvblocks {

struct Link;
struct RemoteCache;
struct TableEntry;

// A backend's state for one peer (an endpoint, a pidfd, mappings); the link holds it for its life.
class PeerState {
 public:
  virtual ~PeerState() = default;
};

// What this engine's options say about offering backends (kvblocks.Transport and its companions).
struct OfferOptions {
  std::string transport = "auto";  // auto | shm | tcp | ucx
  bool trusted_network = false;    // kvblocks.UcxTrustedNetwork=1 (and no Integrity): RMA may be offered
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char *name() const = 0;      // logs, metrics labels and link_path only; never compared
  virtual uint64_t capability() const = 0;   // its bit in the handshake: both sides must offer it
  virtual PathMode path_mode() const = 0;    // what its paths are
  virtual bool Serves(MemKind local, MemKind remote) const {
    return local == MemKind::kHost && remote == MemKind::kHost;
  }
  // Whether this engine offers it under `o`; may load a plugin (its first use).
  virtual bool Offered(const OfferOptions &o) const = 0;
  // Whether it can run in this process at all (false with the reason, e.g. a plugin that will not load).
  virtual bool Available(std::string * /*why*/) const { return true; }
  // Its descriptor in the cache table every linked peer receives (nothing by default).
  virtual void Describe(const CacheEntry & /*cache*/, TableEntry * /*entry*/) const {}
  // The cache is gone for good (peers confirmed they stopped): drop what Register or a lazy
  // registration kept for it.
  virtual void Unregister(CacheEntry * /*cache*/) {}
  // From what `link` verified about the peer (never what the peer claims): whether this backend may
  // reach it; `*state` may receive its per-peer state. Called once both sides' capabilities are known.
  virtual bool Attach(Link *link, std::shared_ptr<PeerState> *state) = 0;
  // Its path to one remote cache, null when it cannot reach that one (the next backend is asked).
  virtual std::shared_ptr<Path> PathFor(Link *link, PeerState *state, RemoteCache &rc) = 0;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_H_
