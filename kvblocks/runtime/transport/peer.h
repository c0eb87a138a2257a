// SPDX-License-Identifier: Apache-2.0
// What a backend sees of a link to one peer (PeerLink): the facts the handshake verified, the peer's
// cache table as seen at link time, the backends attached to it, and the four things a backend asks
// of the link (open a data channel, send a control frame, close one of its sockets, fail it). link/
// fills and implements it (link/link.h: a Link is one); transport/ reads only this, never link/.
// The facts are plain fields, read without a call: the per-block paths check `alive` and the pidfd
// directly; the virtuals run once per channel, per control frame or per failure.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_PEER_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_PEER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "metrics/stats.h"
#include "transport/backend.h"
#include "transport/local_peer.h"
#include "transport/path.h"
#include "wire/messages.h"
#include "wire/table.h"

namespace kvblocks {

// The peer's cache as seen through a link.
struct RemoteCache : TableEntry {
  // Shared by copies of this entry. Transfers hold `mu` shared; the peer's CACHE_GONE takes it
  // exclusively and sets `gone` before it is acknowledged, so no one-sided copy touches memory
  // the peer frees after unregistering.
  struct Liveness {
    std::shared_mutex mu;
    bool gone = false;
    std::set<int64_t> released_keys;  // batch keys the owner (or we) released since linking
  };
  std::shared_ptr<Liveness> live = std::make_shared<Liveness>();
  std::shared_ptr<Path> path;
  explicit RemoteCache(TableEntry e) : TableEntry(std::move(e)) {}
};

struct RemoteUse {
  std::shared_lock<std::shared_mutex> lock;
  bool ok;
  explicit RemoteUse(const RemoteCache &rc) : lock(rc.live->mu), ok(!rc.live->gone) {}
};

// A backend attached to one peer, with its state for that peer.
struct Attached {
  Backend *backend = nullptr;
  std::shared_ptr<PeerState> state;
};

struct PeerLink {
  virtual ~PeerLink() = default;

  uint64_t remote_cluster_id = 0;
  std::atomic<bool> alive{true};
  std::shared_ptr<metrics::PeerStats> stats;  // the peer's counters (set by NewLink, never null after)
  bool opener = false;          // we connected: only this side opens data channels
  int64_t clock_offset_ns = 0;  // peer clock = local clock + offset (the bound that errs early)
  int64_t clock_slack_ns = 0;   // how early the peer may stop serving our request: the offset's error
  PeerIdentity peer;          // claimed: hints only
  LocalPeer local;            // kernel-verified same-host peer (pid, pidfd, memfds); pid 0 when none
  uint64_t capabilities = 0;  // offered by both sides
  bool integrity = false;     // kvblocks.Integrity=crc32c on our side: our served requests carry CRC32C
  bool encrypted = false;     // kvblocks.Encryption=tls: every connection of the link runs TLS
  bool same_process = false;  // verified: the peer proved it is an engine of this process
  bool same_host = false;     // verified: same_process or local.pid
  // The backends that may reach the peer, most preferred first, each with its state for this peer
  // (transport/registry.h); set by ChoosePaths (and AttachLater) before the link is registered.
  std::vector<Attached> attached;
  std::map<int64_t, RemoteCache> caches;  // immutable once the link is registered: read without locks

  // Opener side: connects and authenticates one more data channel; -1 with *st when it cannot.
  virtual int OpenChannel(ConnKind kind, int64_t deadline, llm_datadist::Status *st) = 0;
  // Sends a control frame unless the control connection is already closed.
  virtual bool SendCtrl(uint16_t type, int64_t deadline, const std::string &payload = std::string()) = 0;
  virtual void ForgetFd(int fd) = 0;  // one of the link's sockets: closes it
  virtual void Fail() = 0;            // marks it dead, wakes everyone; the attached backends let go
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_PEER_H_
