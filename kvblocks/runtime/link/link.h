// SPDX-License-Identifier: Apache-2.0
// A link to one peer: its cache table as seen at link time, the path to each cache, the backends
// attached to it (each with its state: the served backend's is the pool of data channels) and the
// control connection.
#ifndef KVBLOCKS_RUNTIME_LINK_LINK_H_
#define KVBLOCKS_RUNTIME_LINK_LINK_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "wire/table.h"
#include "llm_datadist/llm_datadist.h"
#include "metrics/stats.h"
#include "transport/peer.h"
#include "transport/registry.h"
#include "wire/messages.h"

namespace kvblocks {

using ChannelOpener = std::function<int(ConnKind kind, int64_t deadline, llm_datadist::Status *st)>;

// The link's own bookkeeping; what backends read of it (the verified facts, the peer's table, the
// attached backends) is its PeerLink part (transport/peer.h). final: calls through a Link are direct.
struct Link final : PeerLink {
  std::atomic<bool> registered{false};  // it was up: its failure counts as a break
  std::string remote_ip;
  std::string peer_addr;  // the peer's IP address as the kernel reports it (link caps count by it)
  uint16_t remote_port = 0;
  uint8_t token[16] = {};
  int ctrl_fd = -1;
  std::set<int64_t> shown;  // our cache ids in the table the peer got (set before the link is used)
  // Caches the peer registered after linking, learned one at a time on first use (CACHE_QUERY,
  // engine/late.cc) and reached over the served path only. At most kMaxLateCaches: the oldest is forgotten
  // (asked for again when next used), and one the peer unregistered (CACHE_GONE) at once. A
  // transfer holds its entry by shared_ptr, so forgetting one never pulls it from under a transfer.
  std::shared_mutex late_mu;
  std::map<int64_t, std::shared_ptr<RemoteCache>> late;  // guarded by late_mu
  std::deque<int64_t> late_order;                         // guarded by late_mu: `late`'s ids, oldest first
  uint64_t late_bytes = 0;  // guarded by late_mu: TableFootprint of `late`, at most kMaxLinkTableBytes
  std::set<int64_t> late_shown;  // guarded by late_mu: our caches the peer learned by CACHE_QUERY
  // Link-time table first (no lock; a pointer that does not own: valid while the link is held),
  // then `late` (shared lock); never asks the peer. Null when neither has it.
  std::shared_ptr<RemoteCache> FindCache(int64_t id);
  void AddLate(std::shared_ptr<RemoteCache> rc);  // under late_mu: makes room first; a newer answer replaces
  std::shared_ptr<RemoteCache> ForgetLate(int64_t id);  // removes it from `late`; returns it
  bool Shown(int64_t id);  // `shown` or `late_shown`
  // The peer has closed (or reset) the control connection, though ControlChannel::Run may not have seen it yet.
  bool CtrlClosedByPeer();
  ChannelOpener open_channel;  // opener side: connects and authenticates one more data channel
  int OpenChannel(ConnKind kind, int64_t deadline, llm_datadist::Status *st) override {
    return open_channel(kind, deadline, st);
  }
  // Address-based transfers (engine/ranges.cc): `caches` sorted by announced address, built once.
  std::once_flag by_addr_once;
  std::vector<std::pair<uint64_t, const RemoteCache *>> by_addr;

  std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  std::set<int> fds;      // every socket of this link, for shutdown
  int reverse_channels = 0;  // opener: channels it serves for the acceptor
  int served_channels = 0;    // acceptor: forward channels it serves
  bool linked_by_us = false;  // LinkLlmClusters returned success for it here (else: accepted only)
  bool unlink_acked = false;  // UNLINK_ACK, or the peer's own UNLINK
  std::set<int64_t> gone_acked;  // our cache ids the peer confirmed it stopped using
  uint64_t notify_seq = 0;                    // NOTIFYs we sent
  std::map<uint64_t, uint32_t> notify_acks;  // their NOTIFY_ACK statuses, until the sender takes them
  // CACHE_QUERYs in flight, by (kind, cache id or key): the query's seq, the answer's status (kLatePending until
  // it comes) and the callers waiting for it; the last to leave erases it, so an answer nobody
  // waits for is dropped.
  struct LateQuery {
    uint64_t seq;
    uint32_t status;
    int waiters = 0;
    std::shared_ptr<RemoteCache> entry;  // the answer's, when found
  };
  std::map<std::pair<int, int64_t>, LateQuery> late_queries;
  uint64_t late_seq = 0;  // CACHE_QUERYs we sent
  std::mutex ctrl_write_mu;

  void AddFd(int fd);
  void ForgetFd(int fd) override;  // closes it
  void Shutdown();        // wakes every blocked I/O on the link (and the attached backends' waiters)
  void Fail() override;   // marks it dead, wakes everyone; the attached backends let go (idle channels)
  void CountEnd();        // in the peer's metrics: an unlink or a break
  // Sends a control frame unless the control connection is already closed (ctrl_fd = -1).
  bool SendCtrl(uint16_t type, int64_t deadline, const std::string &payload = std::string()) override;
  void CloseCtrl();  // closes ctrl_fd under ctrl_write_mu, so no writer can hit a reused fd
  std::string PathName() const;      // DescribePaths: backend names joined by "+"
  ~Link() override;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_LINK_H_
