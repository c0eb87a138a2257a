// SPDX-License-Identifier: Apache-2.0
// The linker (link/linker.h): the opener side of LinkLlmClusters / UnlinkLlmClusters and the
// accepting side of every connection.
#include "link/linker.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "kvblocks/error.h"
#include "common/util.h"
#include "link/handshake.h"
#include "net/socket.h"
#include "net/tls.h"
#include "transport/beacon.h"
#include "transport/local_peer.h"
#include "transport/registry.h"
#include "transport/select.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

Linker::Linker(uint64_t cluster_id, LinkerHost *host, LinkRegistry *links, ControlChannel *control,
               metrics::EngineStats *stats, std::shared_timed_mutex *table_mu, const std::atomic<bool> *stopping)
    : cluster_id_(cluster_id), host_(host), links_(links), control_(control), stats_(stats), table_mu_(table_mu),
      stopping_(stopping) {
  RandomBytes(&instance_token_, sizeof(instance_token_));
  RandomBytes(&probe_value_, sizeof(probe_value_));
}

void Linker::Finalize() {
  std::lock_guard<std::mutex> g(engine_states_mu_);
  engine_states_.clear();  // each gone once the last link and registration let go of it
}

void Linker::DropLink(const std::shared_ptr<Link> &link) {
  link->Fail();
  links_->Erase(link);
}

namespace {
// A frame with flags (kFlagCrossing) and no payload.
IoResult SendFlagged(int fd, uint16_t type, uint16_t flags, uint32_t status, int64_t deadline) {
  FrameHeader h;
  h.type = type;
  h.flags = flags;
  h.status = status;
  uint8_t hdr[kFrameHeaderBytes];
  EncodeHeader(h, hdr);
  iovec iov{hdr, sizeof(hdr)};
  return SendIov(fd, &iov, 1, deadline);
}

// Receives one handshake frame of `type` (any status); false when it is another type, longer than
// its type may be (kPayloadLimits) or malformed.
bool RecvTyped(int fd, uint16_t type, int64_t deadline, FrameHeader *h, std::string *payload) {
  return RecvHeader(fd, h, deadline) == IoResult::kOk && h->type == type &&
         RecvPayload(fd, *h, Channel::kHandshake, payload, deadline) == IoResult::kOk;
}
}  // namespace

void Linker::FillLinkInfo(LinkInfo *info) {
  info->capabilities = OfferedCapabilities(opt_.backends);
  FillIdentity(instance_token_, &probe_value_, &info->identity);
  info->clock_ns = NowNs();
  info->caches = host_->DescribeCaches();  // never with attach data: that goes in BACKEND_ATTACH (SendAttachData)
  RandomBytes(info->local_key, sizeof(info->local_key));
}

AttachEnv Linker::EnvFor(const Backend *b, int fd) {
  AttachEnv env;
  env.ctrl_fd = fd;
  env.find_cache = [this](int64_t id) { return host_->OurCache(id); };
  std::lock_guard<std::mutex> g(engine_states_mu_);
  auto it = engine_states_.find(b);
  if (it == engine_states_.end() && host_->Running()) it = engine_states_.emplace(b, b->NewEngineState()).first;
  if (it != engine_states_.end()) env.engine = it->second;
  return env;
}

// Each backend both sides offered that exchanges attach data: ours for this link, from `shown` (our
// link-time table), only after the peer's CONFIRM. The form that offers nothing when `refuse`.
Status Linker::SendAttachData(int fd, const Link &link, const std::vector<TableEntry> &shown, bool refuse,
                              int64_t deadline) {
  for (Backend *b : AttachExchangers(link.capabilities)) {
    BackendAttach m;
    m.backend = BackendId(*b);
    m.data = b->AttachData(EnvFor(b, fd), shown, refuse);
    const IoResult ir = SendMessage(fd, kBackendAttach, LLM_SUCCESS, m, deadline);
    if (ir != IoResult::kOk) return StatusOf(ir);
  }
  return LLM_SUCCESS;
}

// The peer's attach data, in the same order, each checked by its backend against the link's table.
// False when one did not come, or is malformed, for another backend or inconsistent (*st says which).
bool Linker::RecvAttachData(int fd, Link *link, int64_t deadline, Learned *learned, Status *st) {
  for (Backend *b : AttachExchangers(link->capabilities)) {
    FrameHeader h;
    std::string payload;
    BackendAttach m;
    if (!RecvTyped(fd, kBackendAttach, deadline, &h, &payload)) {
      *st = NowNs() >= deadline ? LLM_TIMEOUT : LLM_LINK_FAILED;
      return false;
    }
    std::shared_ptr<PeerState> got;
    if (!Decode(payload, &m) || m.backend != BackendId(*b) || !b->TakeAttachData(*link, m.data, &got)) {
      *st = Fail(LLM_LINK_FAILED, "cluster %llu sent malformed %s attach data",
                 static_cast<unsigned long long>(link->remote_cluster_id), b->name());
      return false;
    }
    if (got) (*learned)[b] = std::move(got);
  }
  return true;
}

// Attaches `b` after CONFIRM from what the peer's attach data taught us (none: null). The link fails
// only when kvblocks.Transport selects `b` and it could not attach.
Status Linker::AttachAfterConfirm(Backend *b, Link *link, int fd, const Learned &learned) {
  const bool required = opt_.backends.transport == b->transport_option();
  auto it = learned.find(b);
  std::string why;
  if (b->AttachAfterConfirm(EnvFor(b, fd), link, it == learned.end() ? nullptr : it->second, required, &why) ||
      !required)
    return LLM_SUCCESS;
  const char *t = b->transport_option();
  LogWarn("kvblocks.Transport=%s, but cluster %llu cannot be reached over %s: %s", t,
          static_cast<unsigned long long>(link->remote_cluster_id), b->name(), why.c_str());
  return Fail(LLM_LINK_FAILED, "kvblocks.Transport=%s, but cluster %llu cannot be reached over %s: %s", t,
              static_cast<unsigned long long>(link->remote_cluster_id), b->name(), why.c_str());
}

// kvblocks.Transport selects backends that attach at link time: one of them must suit the link.
Status Linker::TransportSuitsLink(const Link &link) {
  std::string names;
  if (TransportSuits(link, opt_.backends.transport, &names)) return LLM_SUCCESS;
  const char *t = opt_.backends.transport.c_str();
  const unsigned long long peer = link.remote_cluster_id;
  LogWarn("kvblocks.Transport=%s, but none of its backends (%s) reaches cluster %llu", t, names.c_str(), peer);
  return Fail(LLM_LINK_FAILED, "kvblocks.Transport=%s, but none of its backends (%s) reaches cluster %llu", t,
              names.c_str(), peer);
}

// Our memfds for the local exchange, held alive by `keep` while they are sent.
LocalFds Linker::OurMemfds(const std::vector<TableEntry> &caches, std::vector<std::shared_ptr<void>> *keep) {
  LocalFds out;
  const int beacon = OurBeaconFd();  // first, so the cap on memfds never drops it
  if (beacon >= 0) out.emplace_back(kBeaconId, beacon);
  host_->AddMemfds(caches, &out, keep);
  return out;
}

// The peer's table moves into the link (info->caches is left empty): one copy, for the link's life.
std::shared_ptr<Link> Linker::NewLink(uint64_t remote_cluster_id, LinkInfo *info) {
  auto link = std::make_shared<struct Link>();
  link->remote_cluster_id = remote_cluster_id;
  link->stats = stats_->Peer(remote_cluster_id);
  link->peer = info->identity;
  link->capabilities = info->capabilities & OfferedCapabilities(opt_.backends);
  link->integrity = opt_.backends.integrity;
  link->encrypted = opt_.tls != nullptr;
  for (TableEntry &e : info->caches) link->caches.emplace(e.id, RemoteCache(std::move(e)));
  std::vector<TableEntry>().swap(info->caches);
  return link;
}

namespace {
// A peer refuses a table of more entries or decoded state than it keeps (DecodeTable): say so here,
// rather than have it answer a malformed LINK_INFO.
Status TableFits(const std::vector<TableEntry> &caches) {
  uint64_t bytes = 0;
  for (const TableEntry &c : caches) bytes += TableFootprint(c);
  if (caches.size() <= kMaxLinkCaches && bytes <= kMaxLinkTableBytes) return LLM_SUCCESS;
  return Fail(LLM_PARAM_INVALID, "%zu caches registered (%llu bytes of table): a link carries at most %u (%llu bytes)",
              caches.size(), static_cast<unsigned long long>(bytes), kMaxLinkCaches,
              static_cast<unsigned long long>(kMaxLinkTableBytes));
}

// The peer's IP address of a connected socket, as the kernel has it ("" when it cannot say). An
// IPv4-mapped IPv6 address counts as the IPv4 one.
std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  char buf[INET6_ADDRSTRLEN] = "";
  if (getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in *>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  std::string s = buf;
  return s.rfind("::ffff:", 0) == 0 && s.find('.') != std::string::npos ? s.substr(7) : s;
}

}  // namespace

Status Linker::TakeLinkSlot(const std::string &addr) {
  std::lock_guard<std::mutex> g(link_state_mu_);
  size_t from_addr, total;
  links_->CountAlive(addr, &from_addr, &total);
  from_addr += accepting_.count(addr);
  total += accepting_.size();
  if (from_addr >= opt_.max_links_per_peer) {
    LogWarn("refused a link from %s: it holds %zu links, the most kvblocks.MaxLinksPerPeer (%zu) allows", addr.c_str(),
            from_addr, opt_.max_links_per_peer);
    return LLM_CLUSTER_NUM_EXCEED_LIMIT;
  }
  if (total >= opt_.max_links) {
    LogWarn("refused a link from %s: %zu links, the most kvblocks.MaxLinks (%zu) allows", addr.c_str(), total,
            opt_.max_links);
    return LLM_CLUSTER_NUM_EXCEED_LIMIT;
  }
  accepting_.insert(addr);
  return LLM_SUCCESS;
}

void Linker::ReleaseLinkSlot(const std::string &addr) {
  std::lock_guard<std::mutex> g(link_state_mu_);
  auto it = accepting_.find(addr);
  if (it != accepting_.end()) accepting_.erase(it);
}

// A peer that unlinks (or force-unlinks) and links again at once may reach us before our control
// thread has seen its old control connection close. The kernel knows already (the peer's FIN came
// first): such a link is dead, whatever the peer says, and is failed here rather than refused as
// LLM_ALREADY_LINK.
std::shared_ptr<Link> Linker::LiveLink(uint64_t peer) {
  auto link = links_->FindAlive(peer);
  if (link && link->CtrlClosedByPeer()) {
    link->Fail();
    return nullptr;
  }
  return link;
}

bool Linker::CrossingLoses(uint64_t peer) const {
  // Both sides link to each other at once: the lower cluster id's connection wins.
  return linking_.count(peer) != 0 && cluster_id_ < peer;
}


// ------------------------------------------------------------------ opener side
// Connects and authenticates a connection of `kind` (HELLO .. HELLO_ACK); -1 with *st on failure.
// A listener under a connect flood drops its oldest unauthenticated connections, ours among them
// when the flood outpaces a handshake: one dropped before HELLO_ACK is tried again, with fresh
// nonces, until the deadline (the listener never drops a connection it has authenticated).
int Linker::OpenHandshake(const std::string &ip, uint16_t port, ConnKind kind, uint64_t listener_cluster_id,
                        int64_t deadline, Hello *hello, Transcript *t, Status *st) {
  int64_t pause = kMsNs;
  for (int tries = 1;; ++tries) {
    const int fd = ConnectTcp(ip, port, deadline, st);
    if (fd < 0) return -1;
    bool dropped = false;
    // kvblocks.Encryption=tls: TLS first, then the kvblocks handshake inside it (protocol.md).
    if (opt_.tls) *st = TlsStart(opt_.tls.get(), fd, true, deadline, ip + ":" + std::to_string(port), &dropped);
    if (!opt_.tls || *st == LLM_SUCCESS) {
      hello->kind = kind;
      hello->cluster_id = cluster_id_;
      RandomBytes(hello->nonce, sizeof(hello->nonce));
      *st = ClientHandshake(fd, *hello, listener_cluster_id, ProofKey(fd, opt_.auth_token), deadline, t, &dropped);
    }
    if (*st == LLM_SUCCESS) return fd;
    CloseConn(fd);
    if (!dropped || NowNs() + pause >= deadline || stopping_->load()) return -1;
    if (tries == 1 || tries % 100 == 0)
      LogInfo("%s:%u dropped our handshake before authenticating it (try %d); trying again", ip.c_str(), port, tries);
    std::this_thread::sleep_for(std::chrono::nanoseconds(pause));
    pause = std::min<int64_t>(2 * pause, 20 * kMsNs);
  }
}

int Linker::OpenChannel(const std::shared_ptr<Link> &link, ConnKind kind, int64_t deadline, Status *st) {
  Hello hello;
  Transcript t;
  const int fd = OpenHandshake(link->remote_ip, link->remote_port, kind, link->remote_cluster_id, deadline, &hello,
                               &t, st);
  if (fd < 0) return -1;
  {
    // Only now, to a listener that has proven itself; a MAC of this connection's transcript under
    // the link token, good for this channel of this link only.
    const Bind bind = BindFor(link->token, t);
    FrameHeader h;
    std::string tmp;
    IoResult r = SendMessage(fd, kBind, 0, bind, deadline);
    if (r == IoResult::kOk && !RecvTyped(fd, kBind, deadline, &h, &tmp)) r = IoResult::kError;
    if (r != IoResult::kOk)
      *st = Fail(StatusOf(r), "data channel to cluster %llu: no BIND answer",
                 static_cast<unsigned long long>(link->remote_cluster_id));
    else if (h.status != LLM_SUCCESS)
      *st = Fail(h.status, "cluster %llu refused a data channel (status %u)",
                 static_cast<unsigned long long>(link->remote_cluster_id), h.status);
  }
  if (*st != LLM_SUCCESS) {
    CloseConn(fd);
    return -1;
  }
  link->AddFd(fd);
  return fd;
}

// Every attempt to link to a cluster replaces what its last one recorded: a failure keeps its
// reason and message for LastLinkFailure and is logged (a warning, or at info when the same reason
// repeats, so a caller retrying every 50 ms does not flood the log).
Status Linker::LinkOne(const ClusterInfo &ci, int32_t timeout_ms) {
  const std::string earlier = LastErrorMessage();  // an earlier cluster's failure, for the call's status
  ClearLastError();
  const Status st = LinkOneInner(ci, timeout_ms);
  std::lock_guard<std::mutex> g(why_mu_);
  if (st == LLM_SUCCESS) {
    if (!earlier.empty()) Restate(st, "%s", earlier.c_str());
    link_failures_.erase(ci.remote_cluster_id);
    return st;
  }
  LinkFailure f;
  f.status = st;
  f.reason = LastLinkReason();
  if (f.reason == LinkFailureReason::kNone)
    f.reason = st == LLM_TIMEOUT ? LinkFailureReason::kTimedOut : LinkFailureReason::kOther;
  f.message = LastErrorMessage();
  if (f.message.empty()) f.message = st == LLM_TIMEOUT ? "no answer before the link timeout" : "the link failed";
  auto it = link_failures_.find(ci.remote_cluster_id);
  const bool repeat = it != link_failures_.end() && it->second.reason == f.reason;
  const std::string where = ci.remote_ip_infos.empty() ? std::string("?")
                                                      : std::string(ci.remote_ip_infos[0].ip.GetString()) + ":" +
                                                            std::to_string(ci.remote_ip_infos[0].port);
  (repeat ? LogInfo : LogWarn)("link to cluster %llu at %s failed (%s, %d ms timeout): %s",
                               static_cast<unsigned long long>(ci.remote_cluster_id), where.c_str(),
                               LinkReasonName(f.reason), timeout_ms, f.message.c_str());
  if (it == link_failures_.end() && link_failures_.size() >= kMaxLinkFailures) link_failures_.erase(link_failures_.begin());
  link_failures_[ci.remote_cluster_id] = std::move(f);
  return st;
}

bool Linker::LastLinkFailure(uint64_t cluster_id, LinkFailure *out) {
  std::lock_guard<std::mutex> g(why_mu_);
  auto it = link_failures_.find(cluster_id);
  if (it == link_failures_.end()) return false;
  *out = it->second;
  return true;
}

Status Linker::LinkOneInner(const ClusterInfo &ci, int32_t timeout_ms) {
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * kMsNs;
  const unsigned long long want = ci.remote_cluster_id;
  if (ci.remote_ip_infos.size() != 1)
    return Fail(LLM_PARAM_INVALID, "cluster %llu: %zu remote_ip_infos (needs exactly 1)", want,
                ci.remote_ip_infos.size());
  if (!opt_.local_comm_res && ci.local_ip_infos.size() != 1)
    return Fail(LLM_PARAM_INVALID, "cluster %llu: %zu local_ip_infos (needs exactly 1, or set llm.LocalCommRes)",
                want, ci.local_ip_infos.size());
  std::lock_guard<std::mutex> serial(linking_mu_);
  // A link the peer opened to us is ours to adopt, once: both sides may link, both get success.
  auto adopt = [&]() -> bool {
    auto l = links_->FindAlive(ci.remote_cluster_id);
    if (!l) return false;
    std::lock_guard<std::mutex> g(link_state_mu_);
    l->linked_by_us = true;
    return true;
  };
  {
    std::lock_guard<std::mutex> g(link_state_mu_);
    auto l = links_->FindAlive(ci.remote_cluster_id);
    if (l && l->linked_by_us) return Fail(LLM_ALREADY_LINK, "cluster %llu is already linked", want);
    if (l) {
      l->linked_by_us = true;
      return LLM_SUCCESS;
    }
    size_t unused, total;
    links_->CountAlive("", &unused, &total);
    if (total + accepting_.size() >= opt_.max_links) NoteLinkReason(LinkFailureReason::kLimitExceeded);
    if (total + accepting_.size() >= opt_.max_links)
      return Fail(LLM_CLUSTER_NUM_EXCEED_LIMIT, "cluster %llu: this engine has %zu links, the most kvblocks.MaxLinks allows",
                  want, total + accepting_.size());
    linking_.insert(ci.remote_cluster_id);
  }
  bool crossing = false;
  Status st = OpenLink(ci, deadline, &crossing);
  {
    std::lock_guard<std::mutex> g(link_state_mu_);
    linking_.erase(ci.remote_cluster_id);
  }
  if (st == LLM_SUCCESS) return st;
  if (crossing) {
    // The peer links to us at the same time and its connection wins: wait for it to arrive.
    while (NowNs() < deadline) {
      if (adopt()) return LLM_SUCCESS;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (adopt()) return LLM_SUCCESS;
    return Fail(LLM_TIMEOUT, "cluster %llu links to us at the same time, but its link did not arrive in time", want);
  }
  if (st == LLM_ALREADY_LINK && adopt()) return LLM_SUCCESS;
  return st;
}

Status Linker::OpenLink(const ClusterInfo &ci, int64_t deadline, bool *crossing) {
  const unsigned long long want = ci.remote_cluster_id;
  const std::string ip = ci.remote_ip_infos[0].ip.GetString();
  const uint16_t port = ci.remote_ip_infos[0].port;
  Status st;
  Hello hello;
  Transcript t;
  const int fd = OpenHandshake(ip, port, ConnKind::kCtrl, ci.remote_cluster_id, deadline, &hello, &t, &st);
  if (fd < 0) return st == LLM_TIMEOUT ? LLM_TIMEOUT : LLM_LINK_FAILED;
  host_->TrackLoose(fd);
  int local_fd = -1;
  auto fail = [&](Status s) {
    if (local_fd >= 0) close(local_fd);
    host_->ForgetLoose(fd);
    CloseConn(fd);
    return s;
  };

  // Authenticated both ways: now identity, clock and cache table.
  LinkInfoMsg mine;
  mine.cluster_id = cluster_id_;
  std::shared_lock<std::shared_timed_mutex> table_hold(*table_mu_);  // until the link is registered
  FillLinkInfo(&mine.info);
  if ((st = TableFits(mine.info.caches)) != LLM_SUCCESS) return fail(st);
  std::string payload;
  Encode(mine, &payload);
  SealLinkInfo('O', hello.nonce, t.server_nonce, &payload);
  FrameHeader h;
  const int64_t sent = NowNs();  // the acceptor reads its clock after this and before t1
  IoResult ir = SendFrame(fd, kLinkInfo, 0, payload, deadline);
  if (ir == IoResult::kOk && !RecvTyped(fd, kLinkInfo, deadline, &h, &payload))
    ir = IoResult::kError;
  const int64_t t1 = NowNs();
  if (ir != IoResult::kOk)
    return fail(Fail(StatusOf(ir), "%s:%u: no LINK_INFO answer", ip.c_str(), port));
  if (h.status != LLM_SUCCESS) {
    *crossing = (h.flags & kFlagCrossing) != 0;
    if (h.status == LLM_ALREADY_LINK) NoteLinkReason(LinkFailureReason::kAlreadyLinked);
    if (h.status == LLM_CLUSTER_NUM_EXCEED_LIMIT) NoteLinkReason(LinkFailureReason::kLimitExceeded);
    if (h.status == LLM_ALREADY_LINK)
      return fail(Fail(LLM_ALREADY_LINK, "cluster %llu is already linked (at its side)", want));
    if (h.status == LLM_CLUSTER_NUM_EXCEED_LIMIT)
      return fail(Fail(LLM_CLUSTER_NUM_EXCEED_LIMIT,
                       "%s:%u refused the link: it holds the most links its kvblocks.MaxLinksPerPeer (links "
                       "from our address) or kvblocks.MaxLinks allows",
                       ip.c_str(), port));
    return fail(Fail(h.status == LLM_PARAM_INVALID ? LLM_PARAM_INVALID : LLM_LINK_FAILED,
                     "%s:%u refused the link (status %u)", ip.c_str(), port, h.status));
  }
  LinkInfoMsg theirs;
  if (!Decode(payload, &theirs))
    return fail(Fail(LLM_LINK_FAILED, "%s:%u sent a malformed LINK_INFO", ip.c_str(), port));
  if (theirs.cluster_id != ci.remote_cluster_id) {
    NoteLinkReason(LinkFailureReason::kWrongClusterId);
    return fail(Fail(LLM_LINK_FAILED, "%s:%u is cluster %llu, not cluster %llu", ip.c_str(), port,
                     static_cast<unsigned long long>(theirs.cluster_id), want));
  }
  auto link = NewLink(theirs.cluster_id, &theirs.info);
  for (const auto &c : mine.info.caches) link->shown.insert(c.id);
  link->same_process = FromThisProcess('A', hello.nonce, t.server_nonce, payload);
  memcpy(link->token, theirs.link_token, sizeof(link->token));
  // Each side converts deadlines with the bound of the offset that puts them earliest in the peer's
  // clock: a server then stops no later than the requester's real deadline, so nothing lands after
  // the requester's call returned (it may stop up to clock_slack_ns early).
  link->clock_offset_ns = theirs.info.clock_ns - t1;
  link->clock_slack_ns = t1 - sent;
  link->opener = true;
  link->linked_by_us = true;
  link->remote_ip = ip;
  link->peer_addr = ip;
  link->remote_port = port;
  link->open_channel = [this, weak = std::weak_ptr<struct Link>(link)](ConnKind kind, int64_t dl, Status *s) {
    auto l = weak.lock();
    *s = LLM_NOT_YET_LINK;
    return l ? OpenChannel(l, kind, dl, s) : -1;
  };
  // Same host? Ask the kernel: connect to the acceptor's one-shot local socket (claims only decide
  // whether to try). The exchange also proves the process there owns the far end of `fd`.
  PeerIdentity me;
  FillIdentity(instance_token_, &probe_value_, &me);
  ConnEnds ctrl_ends;
  if (!link->same_process && (link->capabilities & LocalExchangeCapabilities()) != 0 &&
      SameHostHint(me, link->peer) && ConnEndsOf(fd, &ctrl_ends))
    local_fd = ConnectLocal(theirs.info.local_name);
  Confirm confirm{sent - theirs.info.clock_ns, local_fd >= 0};
  ir = SendMessage(fd, kConfirm, 0, confirm, deadline);
  if (ir != IoResult::kOk) return fail(StatusOf(ir));
  if (local_fd >= 0) {
    std::vector<std::shared_ptr<void>> keep;
    const LocalFds fds = OurMemfds(mine.info.caches, &keep);
    OpenerLocalExchange(local_fd, mine.info.local_key, theirs.info.local_key, ctrl_ends, fds, deadline,
                        &link->local);
    close(local_fd);
    local_fd = -1;
  }
  ChoosePaths(link.get());
  // Attach data only now, after CONFIRM, and only for backends both sides offered. A backend whose
  // peer offered something attaches now (a failure fails the link); the others once the acceptor
  // confirmed (so its refusal, not theirs, is what the caller hears).
  Learned learned;
  if ((st = SendAttachData(fd, *link, mine.info.caches, false, deadline)) != LLM_SUCCESS) return fail(st);
  if (!RecvAttachData(fd, link.get(), deadline, &learned, &st)) return fail(st);
  for (Backend *b : AttachExchangers())
    if (learned.count(b) != 0 && (st = AttachAfterConfirm(b, link.get(), fd, learned)) != LLM_SUCCESS) return fail(st);
  if ((st = TransportSuitsLink(*link)) != LLM_SUCCESS) return fail(st);
  std::string tmp;
  if (!RecvTyped(fd, kConfirmAck, deadline, &h, &tmp))
    return fail(NowNs() >= deadline ? LLM_TIMEOUT : LLM_LINK_FAILED);
  if (h.status != LLM_SUCCESS) {
    *crossing = (h.flags & kFlagCrossing) != 0;
    return fail(Fail(h.status, "cluster %llu did not confirm the link (status %u)", want, h.status));
  }
  for (Backend *b : AttachExchangers())
    if (learned.count(b) == 0 && (st = AttachAfterConfirm(b, link.get(), fd, learned)) != LLM_SUCCESS) return fail(st);

  host_->ForgetLoose(fd);
  link->ctrl_fd = fd;
  link->AddFd(fd);
  {
    std::lock_guard<std::mutex> g(link_state_mu_);
    st = links_->Insert(link, *stopping_);
  }
  table_hold.unlock();
  if (st != LLM_SUCCESS) {
    link->Fail();
    return st;
  }
  if (!host_->Spawn([this, link] { control_->Run(link); })) {
    DropLink(link);
    return LLM_LINK_FAILED;
  }
  // One channel each way up front: ours for requests, and one the peer uses to push to us.
  const int fwd = OpenChannel(link, ConnKind::kDataFwd, deadline, &st);
  const int rev = fwd >= 0 ? OpenChannel(link, ConnKind::kDataRev, deadline, &st) : -1;
  if (fwd < 0 || rev < 0) {
    if (fwd >= 0) link->ForgetFd(fwd);
    DropLink(link);
    return st == LLM_TIMEOUT ? LLM_TIMEOUT : LLM_LINK_FAILED;
  }
  RequestChannels *channels = ServedChannels(*link);  // set by ChoosePaths: never null here
  if (channels->Reserve()) channels->Add(fwd);
  {
    std::lock_guard<std::mutex> g(link->mu);
    link->reverse_channels = 1;
  }
  host_->Spawn([this, link, rev] { host_->Serve(rev, link); });
  LogInfo("linked to cluster %llu (%s)", want, link->PathName().c_str());
  return LLM_SUCCESS;
}

// Links are keyed by cluster id, so remote_cluster_id alone names the link to drop (CANN's hixl
// backend unlinks that way); the address, if given, is not used. CANN V2 needs exactly one
// remote_ip_info for a non-force unlink: kvblocks accepts none or one, and more stays PARAM_INVALID.
Status Linker::UnlinkOne(const ClusterInfo &ci, int32_t timeout_ms, bool force) {
  if (!force && ci.remote_ip_infos.size() > 1)
    return Fail(LLM_PARAM_INVALID, "cluster %llu: %zu remote_ip_infos (at most 1)",
                static_cast<unsigned long long>(ci.remote_cluster_id), ci.remote_ip_infos.size());
  auto link = links_->Find(ci.remote_cluster_id);
  if (!link) return LLM_SUCCESS;
  if (force || !link->alive.load()) {
    if (link->alive.exchange(false)) metrics::Add(link->stats->unlinks);  // an unlink, not a break
    DropLink(link);
    return LLM_SUCCESS;
  }
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * kMsNs;
  const bool sent = link->SendCtrl(kUnlink, deadline);
  bool acked = false;
  {
    std::unique_lock<std::mutex> g(link->mu);
    while (sent && !link->unlink_acked && link->alive.load()) {
      const int64_t left = deadline - NowNs();
      if (left <= 0) break;
      link->cv.wait_for(g, std::chrono::nanoseconds(left));
    }
    // A link that died meanwhile is gone as asked: with both ends unlinking, the peer may close
    // the control connection before its acknowledgement reaches us (or the close resets it).
    acked = link->unlink_acked || !link->alive.load();
  }
  if (link->alive.exchange(false)) metrics::Add(link->stats->unlinks);
  DropLink(link);
  if (acked) return LLM_SUCCESS;
  return Fail(LLM_UNLINK_FAILED, "cluster %llu did not acknowledge the unlink",
              static_cast<unsigned long long>(ci.remote_cluster_id));
}

// ------------------------------------------------------------------ acceptor side
void Linker::Accept(int fd) {
  Hello hello;
  Transcript t;
  // Unauthenticated: kAuthNs at most, and a slot that a newer connection may take (ListenLoop).
  // The slot is left once the peer's proof checked out and before it is told so (HELLO_ACK): an
  // authenticated connection is never dropped for a newer one.
  auto leave_slot = [this, fd] { return host_->LeavePreauth(fd); };
  const int64_t auth_deadline = NowNs() + kAuthNs;
  bool ok = !opt_.tls || TlsStart(opt_.tls.get(), fd, false, auth_deadline, PeerAddress(fd)) == LLM_SUCCESS;
  ok = ok && ServerHandshake(fd, ProofKey(fd, opt_.auth_token), cluster_id_, auth_deadline, &hello, &t, leave_slot);
  leave_slot();
  if (!ok) {
    host_->ForgetLoose(fd);
    CloseConn(fd);
    return;
  }
  const int64_t deadline = NowNs() + kHandshakeNs;
  if (hello.kind == ConnKind::kCtrl) {
    AcceptControl(fd, hello, t.server_nonce, deadline);
  } else {
    AcceptChannel(fd, hello, t, deadline);
  }
}

// A data channel of an existing link, proven by a MAC of this connection's transcript under the
// link token; at most kMaxRequesterChannels per link and direction.
void Linker::AcceptChannel(int fd, const Hello &hello, const Transcript &t, int64_t deadline) {
  auto drop = [&] {
    host_->ForgetLoose(fd);
    CloseConn(fd);
  };
  FrameHeader h;
  std::string payload;
  Bind bind;
  if (!RecvTyped(fd, kBind, deadline, &h, &payload) || !Decode(payload, &bind)) return drop();
  auto link = links_->FindAlive(hello.cluster_id);
  Status st = LLM_NOT_YET_LINK;
  if (link && !link->opener) {
    const Bind expect = BindFor(link->token, t);
    if (ConstantTimeEqual(expect.mac, bind.mac, sizeof(bind.mac))) st = LLM_SUCCESS;
  }
  // A forward channel we serve, or a reverse one for our requests (the served backend's pool).
  const bool fwd = hello.kind == ConnKind::kDataFwd;
  RequestChannels *channels = st == LLM_SUCCESS ? ServedChannels(*link) : nullptr;
  if (st == LLM_SUCCESS) {
    bool took = false;
    if (fwd) {
      // The slot is taken under the same lock as the check: concurrent accepts cannot overshoot.
      std::lock_guard<std::mutex> g(link->mu);
      if ((took = link->served_channels < kMaxRequesterChannels)) ++link->served_channels;
    } else {
      took = channels != nullptr && channels->Reserve();
    }
    if (!took) {
      LogWarn("cluster %llu opened more than %d data channels; refusing another",
              static_cast<unsigned long long>(hello.cluster_id), kMaxRequesterChannels);
      st = LLM_LINK_FAILED;
    }
  }
  if (SendFrame(fd, kBind, st, nullptr, 0, deadline) != IoResult::kOk || st != LLM_SUCCESS) {
    if (st == LLM_SUCCESS && fwd) {
      std::lock_guard<std::mutex> g(link->mu);
      --link->served_channels;
    } else if (st == LLM_SUCCESS) {
      channels->Unreserve();
    }
    return drop();
  }
  host_->ForgetLoose(fd);
  link->AddFd(fd);
  if (fwd) {
    host_->Serve(fd, link);
    std::lock_guard<std::mutex> g(link->mu);
    --link->served_channels;
  } else {
    channels->Add(fd);
  }
}

// Control connection: identity, clock, cache tables, the local exchange, then a confirm that
// registers the link.
void Linker::AcceptControl(int fd, const Hello &hello, const uint8_t *server_nonce, int64_t deadline) {
  int lfd = -1;
  auto drop = [&] {
    if (lfd >= 0) close(lfd);
    host_->ForgetLoose(fd);
    CloseConn(fd);
  };
  const uint64_t peer = hello.cluster_id;
  // Counted against the link caps from here until the link is registered (or dropped): before its
  // table is decoded, and before it holds anything for long.
  const std::string addr = PeerAddress(fd);
  const Status slot = TakeLinkSlot(addr);
  std::unique_ptr<const std::string, std::function<void(const std::string *)>> held(
      slot == LLM_SUCCESS ? &addr : nullptr, [this](const std::string *a) { ReleaseLinkSlot(*a); });
  FrameHeader h;
  std::string payload;
  LinkInfoMsg theirs;
  if (!RecvTyped(fd, kLinkInfo, deadline, &h, &payload)) return drop();
  if (slot != LLM_SUCCESS) {
    SendFrame(fd, kLinkInfo, slot, nullptr, 0, deadline);
    return drop();
  }
  if (!Decode(payload, &theirs) || theirs.cluster_id != peer || peer == cluster_id_) {
    SendFrame(fd, kLinkInfo, LLM_PARAM_INVALID, nullptr, 0, deadline);
    return drop();
  }
  {
    std::lock_guard<std::mutex> g(link_state_mu_);
    // A live link is never torn down by a new handshake; a crossing one is resolved by cluster id.
    const bool live = LiveLink(peer) != nullptr;
    if (live || CrossingLoses(peer)) {
      SendFlagged(fd, kLinkInfo, live ? 0 : kFlagCrossing, LLM_ALREADY_LINK, deadline);
      return drop();
    }
  }
  auto link = NewLink(peer, &theirs.info);
  link->peer_addr = addr;
  link->same_process = FromThisProcess('O', hello.nonce, server_nonce, payload);
  std::string().swap(payload);  // this thread serves the link for its life: keep only the link's table
  LinkInfoMsg mine;
  mine.cluster_id = cluster_id_;
  RandomBytes(link->token, sizeof(link->token));
  memcpy(mine.link_token, link->token, sizeof(mine.link_token));
  std::shared_lock<std::shared_timed_mutex> table_hold(*table_mu_);  // until the link is registered
  FillLinkInfo(&mine.info);
  if (TableFits(mine.info.caches) != LLM_SUCCESS) {  // the opener would refuse it: say why here
    LogWarn("refused a link from cluster %llu: %s", static_cast<unsigned long long>(peer), LastErrorMessage());
    SendFrame(fd, kLinkInfo, LLM_PARAM_INVALID, nullptr, 0, deadline);
    return drop();
  }
  for (const auto &c : mine.info.caches) link->shown.insert(c.id);
  ConnEnds ctrl_ends;  // the local exchange checks the opener owns the far end of `fd`
  if (!link->same_process && (link->capabilities & LocalExchangeCapabilities()) != 0 && ConnEndsOf(fd, &ctrl_ends))
    lfd = ListenLocal(&mine.info.local_name);
  std::string out;
  Encode(mine, &out);
  SealLinkInfo('A', hello.nonce, server_nonce, &out);
  Confirm confirm;
  if (SendFrame(fd, kLinkInfo, LLM_SUCCESS, out, deadline) != IoResult::kOk ||
      !RecvTyped(fd, kConfirm, deadline, &h, &payload) || !Decode(payload, &confirm))
    return drop();
  link->clock_offset_ns = confirm.clock_offset_ns;
  link->clock_slack_ns = NowNs() - mine.info.clock_ns;  // the opener sampled within this window
  if (confirm.local_exchange && lfd >= 0) {
    std::vector<std::shared_ptr<void>> keep;
    const LocalFds fds = OurMemfds(mine.info.caches, &keep);
    // The opener connected before sending CONFIRM: an honest one answers at once, so a peer that
    // asks for the exchange and never connects holds us kAuthNs at most.
    AcceptLocalExchange(lfd, mine.info.local_key, theirs.info.local_key, ctrl_ends, fds,
                        std::min(deadline, NowNs() + kAuthNs), &link->local);
  }
  if (lfd >= 0) close(lfd);
  lfd = -1;
  ChoosePaths(link.get());
  Status st = TransportSuitsLink(*link) != LLM_SUCCESS ? LLM_LINK_FAILED : LLM_SUCCESS;
  bool attach_ok = true;
  Learned learned;
  if (st == LLM_SUCCESS && !AttachExchangers(link->capabilities).empty()) {
    // The opener's attach data first; ours only to an opener whose own was sound and whose link we
    // are not about to refuse (a refusal below finds the same live or crossing link).
    bool refuse = !RecvAttachData(fd, link.get(), deadline, &learned, &st);
    if (st == LLM_TIMEOUT) return drop();
    {
      std::lock_guard<std::mutex> g(link_state_mu_);
      refuse = refuse || links_->FindAlive(peer) || CrossingLoses(peer);
    }
    if (SendAttachData(fd, *link, mine.info.caches, refuse, deadline) != LLM_SUCCESS) return drop();
    attach_ok = !refuse;
  }
  for (Backend *b : AttachExchangers())
    if (st == LLM_SUCCESS && attach_ok) st = AttachAfterConfirm(b, link.get(), fd, learned);
  uint16_t flags = 0;
  if (st == LLM_SUCCESS) {
    std::lock_guard<std::mutex> g(link_state_mu_);
    if (LiveLink(peer)) {
      st = LLM_ALREADY_LINK;
    } else if (CrossingLoses(peer)) {
      st = LLM_ALREADY_LINK;
      flags = kFlagCrossing;
    } else {
      link->ctrl_fd = fd;
      st = links_->Insert(link, *stopping_);
      if (st != LLM_SUCCESS) link->ctrl_fd = -1;
    }
  }
  held.reset();  // registered (it counts itself now) or about to be dropped
  table_hold.unlock();
  if (SendFlagged(fd, kConfirmAck, flags, st, deadline) != IoResult::kOk || st != LLM_SUCCESS) {
    if (st == LLM_SUCCESS) {
      {
        std::lock_guard<std::mutex> g(link->ctrl_write_mu);
        link->ctrl_fd = -1;  // the fd is closed by drop() below; no writer may use it after
      }
      DropLink(link);
    }
    return drop();
  }
  host_->ForgetLoose(fd);
  link->AddFd(fd);
  // This thread serves the link for its life: what the handshake decoded and encoded goes first.
  std::string().swap(payload);
  std::string().swap(out);
  std::vector<TableEntry>().swap(mine.info.caches);
  control_->Run(link);
}


}  // namespace kvblocks
