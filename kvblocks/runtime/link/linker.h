// SPDX-License-Identifier: Apache-2.0
// The linker: makes and ends links. The opener side (LinkLlmClusters: connect, authenticate,
// exchange identity, clock and cache tables, the local exchange, CONFIRM, backends' attach data, the first
// data channels) and the accepting side of every connection the listener hands it (a data channel
// of a link, or a control connection that becomes a link and is then served by the ControlChannel).
// What it needs of the engine that owns it comes through LinkerHost, so link/ knows no engine.
#ifndef KVBLOCKS_RUNTIME_LINK_LINKER_H_
#define KVBLOCKS_RUNTIME_LINK_LINKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "kvblocks/ext.h"
#include "link/control.h"
#include "link/link.h"
#include "link/registry.h"
#include "llm_datadist/llm_datadist.h"
#include "metrics/stats.h"
#include "transport/local_peer.h"

namespace kvblocks {

class TlsContext;

// The engine's options that decide how links are made (set by Initialize, before any link).
struct LinkerOptions {
  BackendOptions backends;            // kvblocks.Transport and what decides which backends are offered
  std::string auth_token;             // kvblocks.AuthToken
  std::shared_ptr<TlsContext> tls;    // kvblocks.Encryption=tls: every connection of a link
  bool local_comm_res = false;        // llm.LocalCommRes: a cluster needs no local_ip_infos
  size_t max_links = 0;               // kvblocks.MaxLinks
  size_t max_links_per_peer = 0;      // kvblocks.MaxLinksPerPeer
};

// What the linker asks of the engine that owns it. Called from linking and handshake threads.
class LinkerHost {
 public:
  // Our cache table as a new link shows it (never with attach data: that goes in BACKEND_ATTACH).
  virtual std::vector<TableEntry> DescribeCaches() = 0;
  // Appends the memfds of `shown`'s caches that have one (id, fd), at most kMaxLocalFds in `out`
  // in all; `keep` holds them open while they are sent.
  virtual void AddMemfds(const std::vector<TableEntry> &shown, LocalFds *out,
                         std::vector<std::shared_ptr<void>> *keep) = 0;
  // Our cache `id`, for a backend's attach data (transport/backend.h AttachEnv); null when gone.
  virtual std::shared_ptr<LocalMemory> OurCache(int64_t id) = 0;
  virtual bool Spawn(std::function<void()> fn) = 0;  // a runtime thread; false when none started
  virtual void Serve(int fd, const std::shared_ptr<Link> &link) = 0;  // serves a data channel until it closes
  virtual void TrackLoose(int fd) = 0;   // a socket still handshaking: Finalize wakes it
  virtual void ForgetLoose(int fd) = 0;  // it became part of a link, or was closed
  // Takes an accepted connection out of the pre-authentication slots; false when the listener
  // dropped it already.
  virtual bool LeavePreauth(int fd) = 0;
  virtual bool Running() const = 0;  // initialized and not finalized

 protected:
  ~LinkerHost() = default;
};

class Linker {
 public:
  Linker(uint64_t cluster_id, LinkerHost *host, LinkRegistry *links, ControlChannel *control,
         metrics::EngineStats *stats, std::shared_timed_mutex *table_mu, const std::atomic<bool> *stopping);
  Linker(const Linker &) = delete;
  Linker &operator=(const Linker &) = delete;

  void Configure(const LinkerOptions &o) { opt_ = o; }  // only while no link is being made
  const LinkerOptions &options() const { return opt_; }
  uint64_t instance_token() const { return instance_token_; }

  // Links to `ci` (exactly one remote address; a local one unless local_comm_res): LLM_SUCCESS,
  // also for a link the peer opened to us first, or why not (recorded for LastLinkFailure).
  llm_datadist::Status LinkOne(const llm_datadist::ClusterInfo &ci, int32_t timeout_ms);
  // Ends the link to `ci.remote_cluster_id` (UNLINK, waiting for its ack unless `force`).
  llm_datadist::Status UnlinkOne(const llm_datadist::ClusterInfo &ci, int32_t timeout_ms, bool force);
  bool LastLinkFailure(uint64_t cluster_id, LinkFailure *out);  // false: the last attempt succeeded, or none
  // An accepted connection with its whole HELLO here: authenticates it, then serves it for its life
  // (a data channel, or a control connection that becomes a link). Closes it on failure.
  void Accept(int fd);
  // One more data channel of `link` (opener side): its fd, or -1 with *st.
  int OpenChannel(const std::shared_ptr<Link> &link, ConnKind kind, int64_t deadline, llm_datadist::Status *st);
  void Finalize();  // lets go of the backends' engine states (each gone once the last link lets go of it)

 private:
  llm_datadist::Status LinkOneInner(const llm_datadist::ClusterInfo &ci, int32_t timeout_ms);
  llm_datadist::Status OpenLink(const llm_datadist::ClusterInfo &ci, int64_t deadline, bool *crossing);
  int OpenHandshake(const std::string &ip, uint16_t port, ConnKind kind, uint64_t listener_cluster_id,
                    int64_t deadline, Hello *hello, Transcript *t, llm_datadist::Status *st);
  std::shared_ptr<Link> LiveLink(uint64_t peer);
  bool CrossingLoses(uint64_t peer) const;  // under link_state_mu_
  llm_datadist::Status TakeLinkSlot(const std::string &addr);
  void ReleaseLinkSlot(const std::string &addr);
  LocalFds OurMemfds(const std::vector<TableEntry> &caches, std::vector<std::shared_ptr<void>> *keep);
  void AcceptChannel(int fd, const Hello &hello, const Transcript &t, int64_t deadline);
  void AcceptControl(int fd, const Hello &hello, const uint8_t *server_nonce, int64_t deadline);
  void DropLink(const std::shared_ptr<Link> &link);
  std::shared_ptr<Link> NewLink(uint64_t remote_cluster_id, LinkInfo *info);
  void FillLinkInfo(LinkInfo *info);
  // The backends' exchange after CONFIRM (transport/backend.h), per link: what each learned.
  using Learned = std::map<const Backend *, std::shared_ptr<PeerState>>;
  AttachEnv EnvFor(const Backend *b, int fd);
  llm_datadist::Status SendAttachData(int fd, const Link &link, const std::vector<TableEntry> &shown, bool refuse,
                                      int64_t deadline);
  bool RecvAttachData(int fd, Link *link, int64_t deadline, Learned *learned, llm_datadist::Status *st);
  llm_datadist::Status AttachAfterConfirm(Backend *b, Link *link, int fd, const Learned &learned);
  llm_datadist::Status TransportSuitsLink(const Link &link);

  const uint64_t cluster_id_;
  LinkerHost *const host_;
  LinkRegistry *const links_;
  ControlChannel *const control_;
  metrics::EngineStats *const stats_;
  // Handshakes hold it shared from snapshotting our cache table until their link is registered
  // (the engine's cache unregister takes it exclusively).
  std::shared_timed_mutex *const table_mu_;
  const std::atomic<bool> *const stopping_;
  LinkerOptions opt_;
  uint64_t instance_token_ = 0;
  uint64_t probe_value_ = 0;

  std::mutex linking_mu_;  // serialises handshakes that create links
  // Registration decisions (insert, adopt, crossing) of both LinkOne and the accepting side.
  std::mutex link_state_mu_;
  std::set<uint64_t> linking_;  // clusters our LinkOne is linking to right now
  // Peer addresses of control connections accepted past authentication whose link is not
  // registered yet: they count against the link caps (TakeLinkSlot) as links do.
  std::multiset<std::string> accepting_;
  // Why the last link attempt to each cluster failed (LinkOne); at most kMaxLinkFailures clusters.
  static constexpr size_t kMaxLinkFailures = 4096;
  std::mutex why_mu_;
  std::map<uint64_t, LinkFailure> link_failures_;
  // Each backend's state for this engine (Backend::NewEngineState), made on first need while running.
  std::mutex engine_states_mu_;
  std::map<const Backend *, std::shared_ptr<EngineState>> engine_states_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_LINKER_H_
