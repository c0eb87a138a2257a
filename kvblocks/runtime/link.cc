// SPDX-License-Identifier: Apache-2.0
// Links: the TCP handshake (with optional HMAC challenge-response), channels, control loop,
// and the choice of data path per peer.
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "runtime.h"

namespace kvblocks {

bool IsLocalInstance(uint64_t token);

namespace {
constexpr int64_t kHandshakeNs = 10LL * 1000000000LL;  // bound on a peer that stalls mid-handshake
constexpr int kMaxRequesterChannels = 8;
constexpr uint64_t kMaxHelloBytes = 16ULL << 20;  // read before authentication: keep it bounded
constexpr size_t kIdentityBytes = 16 + 8 + 4 + 8 + 8 + 8;

void PutIdentity(Writer *w, const PeerIdentity &id) {
  w->PutBytes(id.boot_id, 16);
  w->Put<uint64_t>(id.netns);
  w->Put<uint32_t>(id.pid);
  w->Put<uint64_t>(id.instance);
  w->Put<uint64_t>(id.probe_addr);
  w->Put<uint64_t>(id.probe_value);
}

bool GetIdentity(Reader *r, PeerIdentity *id) {
  const uint8_t *b = r->Bytes(16);
  if (b == nullptr) return false;
  memcpy(id->boot_id, b, 16);
  id->netns = r->Get<uint64_t>();
  id->pid = r->Get<uint32_t>();
  id->instance = r->Get<uint64_t>();
  id->probe_addr = r->Get<uint64_t>();
  id->probe_value = r->Get<uint64_t>();
  return r->ok;
}

void Proof(const std::string &token, const char *label, const uint8_t *cn, const uint8_t *sn, uint8_t out[32]) {
  uint8_t msg[64];
  const size_t l = strlen(label);
  memcpy(msg, label, l);
  memcpy(msg + l, cn, 16);
  memcpy(msg + l + 16, sn, 16);
  HmacSha256(reinterpret_cast<const uint8_t *>(token.data()), token.size(), msg, l + 32, out);
}

bool ReadPayload(int fd, const FrameHeader &h, std::string *out, int64_t deadline) {
  if (h.length > kMaxControlPayload) return false;
  out->resize(h.length);
  return h.length == 0 || RecvAll(fd, &(*out)[0], h.length, deadline) == IoResult::kOk;
}
}  // namespace

// ------------------------------------------------------------------ Link helpers
void Link::AddFd(int fd) {
  std::lock_guard<std::mutex> g(mu);
  fds.insert(fd);
  if (!alive.load()) shutdown(fd, SHUT_RDWR);
}

void Link::ForgetFd(int fd) {
  std::lock_guard<std::mutex> g(mu);
  if (fds.erase(fd) != 0) close(fd);
}

bool Link::SendCtrl(uint16_t type, int64_t deadline, const void *payload, size_t n) {
  std::lock_guard<std::mutex> g(ctrl_write_mu);
  return ctrl_fd >= 0 && SendFrame(ctrl_fd, type, 0, payload, n, deadline) == IoResult::kOk;
}

void Link::CloseCtrl() {
  int fd;
  {
    std::lock_guard<std::mutex> g(ctrl_write_mu);
    fd = ctrl_fd;
    ctrl_fd = -1;
  }
  if (fd >= 0) ForgetFd(fd);
}

Link::~Link() {
  for (int fd : fds) close(fd);  // channels left behind by a failed link or a late reverse channel
}

void Link::Shutdown() {
  std::lock_guard<std::mutex> g(mu);
  for (int fd : fds) shutdown(fd, SHUT_RDWR);
  cv.notify_all();
}

void Impl::FailLink(const std::shared_ptr<struct Link> &link) {
  link->alive.store(false);
  link->Shutdown();
  std::vector<int> idle;
  {
    std::lock_guard<std::mutex> g(link->mu);
    idle.swap(link->idle);
    link->requester_channels -= static_cast<int>(idle.size());
  }
  for (int fd : idle) link->ForgetFd(fd);
}

void Impl::DropLink(const std::shared_ptr<struct Link> &link, bool erase) {
  FailLink(link);
  if (erase) {
    std::lock_guard<std::mutex> g(links_mu_);
    auto it = links_.find(link->remote_cluster_id);
    if (it != links_.end() && it->second == link) links_.erase(it);
  }
}

std::shared_ptr<struct Link> Impl::FindLink(uint64_t cluster_id) {
  std::lock_guard<std::mutex> g(links_mu_);
  auto it = links_.find(cluster_id);
  return it == links_.end() ? nullptr : it->second;
}

void Impl::FillIdentity(PeerIdentity *id) {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  size_t k = 0;
  for (size_t i = 0; i + 1 < s.size() && k < 16;) {
    if (s[i] == '-') {
      ++i;
      continue;
    }
    unsigned v;
    if (sscanf(s.c_str() + i, "%2x", &v) != 1) break;
    id->boot_id[k++] = static_cast<uint8_t>(v);
    i += 2;
  }
  struct stat st;
  id->netns = stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  id->pid = static_cast<uint32_t>(getpid());
  id->instance = instance_token_;
  id->probe_addr = reinterpret_cast<uint64_t>(&probe_value_);
  id->probe_value = probe_value_;
}

void Impl::SnapshotCaches(std::string *out) {
  std::vector<std::shared_ptr<CacheEntry>> list;
  {
    std::shared_lock<std::shared_mutex> g(caches_mu_);
    for (auto &kv : caches_) list.push_back(kv.second);
  }
  SerializeCacheTable(list, out);
}

// Decides, once per link, how bytes reach each of the peer's caches.
void Impl::ResolvePaths(struct Link *link) {
  PeerIdentity me;
  FillIdentity(&me);
  const bool same_boot = memcmp(me.boot_id, link->peer.boot_id, 16) == 0;
  link->same_host = same_boot && me.netns == link->peer.netns && me.netns != 0;
  link->same_process = link->same_host && link->peer.pid == me.pid && IsLocalInstance(link->peer.instance);
  link->force_tcp = transport_ == "tcp" || !link->same_host;
  if (link->force_tcp) return;
  if (link->same_process) {
    link->cma_ok = true;
  } else {
    // Cross-memory attach needs ptrace permission on the peer; probe it on a known cookie.
    uint64_t got = 0;
    iovec l{&got, sizeof(got)};
    iovec r{reinterpret_cast<void *>(link->peer.probe_addr), sizeof(got)};
    link->cma_ok = process_vm_readv(static_cast<pid_t>(link->peer.pid), &l, 1, &r, 1, 0) == sizeof(got) &&
                   got == link->peer.probe_value;
  }
  for (auto &kv : link->caches) {
    RemoteCache &rc = kv.second;
    if (rc.peer_fd >= 0) {  // bounds were checked when the table was parsed
      rc.mapped = SharedRegion::MapPeer(static_cast<int>(link->peer.pid), rc.peer_fd, rc.ino, rc.dev, rc.region_size);
      if (rc.mapped) {
        for (uint32_t i = 0; i < rc.num_tensors; ++i) rc.view.push_back(rc.mapped->base + i * rc.pitch);
        continue;
      }
    }
    if (link->same_process) {
      for (uint64_t a : rc.addrs) rc.view.push_back(reinterpret_cast<uint8_t *>(a));
    } else if (link->cma_ok) {
      rc.cma = true;
    }
  }
}

// ------------------------------------------------------------------ client side
Status Impl::Handshake(int fd, ConnKind kind, const uint8_t *link_token, const std::string &extra, int64_t deadline,
                       std::string *reply) {
  uint8_t cn[16];
  RandomBytes(cn, sizeof(cn));
  Writer w;
  w.Put<uint32_t>(kProtocolVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(kind));
  w.Put<uint64_t>(cluster_id_);
  w.PutBytes(cn, 16);
  w.PutBytes(link_token, 16);
  w.PutBytes(extra.data(), extra.size());
  auto io_status = [](IoResult r) { return r == IoResult::kTimeout ? LLM_TIMEOUT : LLM_LINK_FAILED; };
  IoResult r = SendFrame(fd, kHello, 0, w.buf.data(), w.buf.size(), deadline);
  if (r != IoResult::kOk) return io_status(r);
  FrameHeader h;
  r = RecvHeader(fd, &h, deadline);
  if (r != IoResult::kOk) return io_status(r);
  std::string ch;
  if (h.type != kChallenge || h.length != 50 || !ReadPayload(fd, h, &ch, deadline)) return LLM_LINK_FAILED;
  const uint8_t *sn = reinterpret_cast<const uint8_t *>(ch.data());
  const bool auth_required = ch[16] != 0, has_proof = ch[17] != 0;
  // Always answer the challenge first, so a listener with a different token sees and logs it.
  uint8_t auth[33] = {};
  if (!auth_token_.empty()) {
    auth[0] = 1;
    Proof(auth_token_, "kvblocks-client", cn, sn, auth + 1);
  }
  r = SendFrame(fd, kAuth, 0, auth, sizeof(auth), deadline);
  if (r != IoResult::kOk) return io_status(r);
  bool server_ok = true;
  if (!auth_token_.empty()) {
    uint8_t expect[32];
    Proof(auth_token_, "kvblocks-server", cn, sn, expect);
    server_ok = has_proof && ConstantTimeEqual(expect, sn + 18, 32);
  } else if (auth_required) {
    LogWarn("link refused: the listener requires kvblocks.AuthToken and none is set");
  }
  r = RecvHeader(fd, &h, deadline);
  if (r != IoResult::kOk) return io_status(r);
  if (h.type != kHelloAck || !ReadPayload(fd, h, reply, deadline)) return LLM_LINK_FAILED;
  if (!server_ok) {
    LogWarn("link refused: the listener did not prove knowledge of kvblocks.AuthToken");
    return LLM_LINK_FAILED;
  }
  return h.status;
}

int Impl::OpenChannel(const std::shared_ptr<struct Link> &link, ConnKind kind, int64_t deadline, Status *st) {
  const int fd = ConnectTcp(link->remote_ip, link->remote_port, deadline, st);
  if (fd < 0) return -1;
  std::string reply;
  *st = Handshake(fd, kind, link->token, std::string(), deadline, &reply);
  if (*st != LLM_SUCCESS) {
    close(fd);
    return -1;
  }
  link->AddFd(fd);
  return fd;
}

Status Impl::LinkOne(const ClusterInfo &ci, int32_t timeout_ms) {
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * 1000000LL;
  if (ci.remote_ip_infos.size() != 1) return LLM_PARAM_INVALID;
  if (!local_comm_res_ && ci.local_ip_infos.size() != 1) return LLM_PARAM_INVALID;
  const std::string ip = ci.remote_ip_infos[0].ip.GetString();
  const uint16_t port = ci.remote_ip_infos[0].port;
  {
    auto existing = FindLink(ci.remote_cluster_id);
    if (existing && existing->alive.load()) return LLM_ALREADY_LINK;
  }
  std::lock_guard<std::mutex> serial(linking_mu_);
  Status st;
  const int fd = ConnectTcp(ip, port, deadline, &st);
  if (fd < 0) return st == LLM_TIMEOUT ? LLM_TIMEOUT : LLM_LINK_FAILED;
  {
    std::lock_guard<std::mutex> g(workers_mu_);
    loose_fds_.insert(fd);
  }
  auto forget_loose = [&] {
    std::lock_guard<std::mutex> g(workers_mu_);
    loose_fds_.erase(fd);
  };
  PeerIdentity me;
  FillIdentity(&me);
  Writer extra;
  PutIdentity(&extra, me);
  const int64_t t0 = NowNs();
  extra.Put<int64_t>(t0);
  std::string table;
  SnapshotCaches(&table);
  extra.PutBytes(table.data(), table.size());
  std::string reply;
  st = Handshake(fd, ConnKind::kCtrl, std::vector<uint8_t>(16, 0).data(), extra.buf, deadline, &reply);
  const int64_t t1 = NowNs();
  auto fail = [&](Status s) {
    forget_loose();
    close(fd);
    return s;
  };
  if (st != LLM_SUCCESS) return fail(st == LLM_ALREADY_LINK || st == LLM_TIMEOUT ? st : LLM_LINK_FAILED);

  auto link = std::make_shared<struct Link>();
  Reader r{reinterpret_cast<const uint8_t *>(reply.data()), reply.size()};
  link->remote_cluster_id = r.Get<uint64_t>();
  if (!GetIdentity(&r, &link->peer)) return fail(LLM_LINK_FAILED);
  const int64_t peer_now = r.Get<int64_t>();
  const uint8_t *tok = r.Bytes(16);
  if (!r.ok || tok == nullptr || !ParseCacheTable(r.p + r.off, r.n - r.off, &link->caches))
    return fail(LLM_LINK_FAILED);
  memcpy(link->token, tok, 16);
  link->clock_offset_ns = peer_now - (t0 + (t1 - t0) / 2);
  link->opener = true;
  link->remote_ip = ip;
  link->remote_port = port;
  {
    auto existing = FindLink(link->remote_cluster_id);
    if (existing && existing->alive.load()) return fail(LLM_ALREADY_LINK);
  }
  ResolvePaths(link.get());
  if (transport_ == "shm" && !link->same_host) {
    LogWarn("kvblocks.Transport=shm, but cluster %llu is on another host",
            static_cast<unsigned long long>(link->remote_cluster_id));
    return fail(LLM_LINK_FAILED);
  }
  const int64_t back = -link->clock_offset_ns;
  if (SendFrame(fd, kConfirm, 0, &back, sizeof(back), deadline) != IoResult::kOk) return fail(LLM_LINK_FAILED);
  FrameHeader h;
  std::string tmp;
  const IoResult ir = RecvHeader(fd, &h, deadline);
  if (ir != IoResult::kOk) return fail(ir == IoResult::kTimeout ? LLM_TIMEOUT : LLM_LINK_FAILED);
  if (h.type != kConfirmAck || !ReadPayload(fd, h, &tmp, deadline)) return fail(LLM_LINK_FAILED);
  if (h.status != LLM_SUCCESS) return fail(h.status);

  forget_loose();
  link->ctrl_fd = fd;
  link->AddFd(fd);
  {
    std::lock_guard<std::mutex> g(links_mu_);
    if (stopping_.load()) {
      link->ForgetFd(fd);
      return LLM_LINK_FAILED;
    }
    auto it = links_.find(link->remote_cluster_id);
    if (it != links_.end()) FailLink(it->second);  // a dead link to a restarted peer is replaced
    links_[link->remote_cluster_id] = link;
  }
  if (!Spawn([this, link] { CtrlLoop(link); })) {
    DropLink(link, true);
    return LLM_LINK_FAILED;
  }
  // One channel each way up front: ours for requests, and one the peer uses to push to us.
  const int fwd = OpenChannel(link, ConnKind::kDataFwd, deadline, &st);
  const int rev = fwd >= 0 ? OpenChannel(link, ConnKind::kDataRev, deadline, &st) : -1;
  if (fwd < 0 || rev < 0) {
    if (fwd >= 0) link->ForgetFd(fwd);
    DropLink(link, true);
    return st == LLM_TIMEOUT ? LLM_TIMEOUT : LLM_LINK_FAILED;
  }
  {
    std::lock_guard<std::mutex> g(link->mu);
    link->idle.push_back(fwd);
    link->requester_channels = 1;
  }
  {
    std::lock_guard<std::mutex> g(link->mu);
    link->reverse_channels = 1;
  }
  Spawn([this, link, rev] { ServeConnection(rev, link); });
  LogInfo("linked to cluster %llu (%s)", static_cast<unsigned long long>(link->remote_cluster_id),
          link->force_tcp ? "tcp" : link->same_process ? "inprocess" : "shm");
  return LLM_SUCCESS;
}

namespace {
bool ValidIpv4(const IpInfo &ip) {
  in_addr a;
  return ip.ip.GetLength() != 0 && inet_pton(AF_INET, ip.ip.GetString(), &a) == 1;
}

// Link and Unlink share the argument checks (CANN order: timeout, addresses, empty list) and the
// result rule: one status per cluster, the call returning the last failure.
template <typename Fn>
Status EachCluster(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms,
                   bool check_local, Fn &&one) {
  if (timeout_ms <= 0) return LLM_PARAM_INVALID;
  for (const auto &c : clusters) {
    for (const auto &ip : c.remote_ip_infos)
      if (!ValidIpv4(ip)) return LLM_PARAM_INVALID;
    if (check_local)
      for (const auto &ip : c.local_ip_infos)
        if (!ValidIpv4(ip)) return LLM_PARAM_INVALID;
  }
  if (clusters.empty()) return LLM_PARAM_INVALID;
  rets.assign(clusters.size(), LLM_SUCCESS);
  Status overall = LLM_SUCCESS;
  for (size_t i = 0; i < clusters.size(); ++i) {
    rets[i] = one(clusters[i]);
    if (rets[i] != LLM_SUCCESS) overall = rets[i];
  }
  return overall;
}
}  // namespace

Status Impl::Link(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  return EachCluster(clusters, rets, timeout_ms, true,
                     [&](const ClusterInfo &c) { return LinkOne(c, timeout_ms); });
}

Status Impl::UnlinkOne(const ClusterInfo &ci, int32_t timeout_ms, bool force) {
  if (!force && ci.remote_ip_infos.size() != 1) return LLM_PARAM_INVALID;
  auto link = FindLink(ci.remote_cluster_id);
  if (!link) return LLM_SUCCESS;
  if (force || !link->alive.load()) {
    DropLink(link, true);
    return LLM_SUCCESS;
  }
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * 1000000LL;
  const bool sent = link->SendCtrl(kUnlink, deadline);
  bool acked = false;
  if (sent) {
    std::unique_lock<std::mutex> g(link->mu);
    while (!link->unlink_acked && link->alive.load()) {
      const int64_t left = deadline - NowNs();
      if (left <= 0) break;
      link->cv.wait_for(g, std::chrono::nanoseconds(left));
    }
    acked = link->unlink_acked;
  }
  DropLink(link, true);
  return acked ? LLM_SUCCESS : LLM_UNLINK_FAILED;
}

Status Impl::Unlink(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms,
                    bool force) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return LLM_FAILED;
  return EachCluster(clusters, rets, timeout_ms, false,
                     [&](const ClusterInfo &c) { return UnlinkOne(c, timeout_ms, force); });
}

// ------------------------------------------------------------------ channels
int Impl::AcquireChannel(const std::shared_ptr<struct Link> &link, int64_t deadline, Status *st) {
  std::unique_lock<std::mutex> g(link->mu);
  for (;;) {
    if (!link->alive.load()) {
      *st = LLM_NOT_YET_LINK;
      return -1;
    }
    if (!link->idle.empty()) {
      const int fd = link->idle.back();
      link->idle.pop_back();
      return fd;
    }
    if (link->opener && link->requester_channels < kMaxRequesterChannels) {
      ++link->requester_channels;
      g.unlock();
      const int fd = OpenChannel(link, ConnKind::kDataFwd, deadline, st);
      g.lock();
      if (fd < 0) {
        --link->requester_channels;
        if (*st != LLM_TIMEOUT) *st = LLM_LINK_FAILED;
      }
      return fd;
    }
    if (!link->opener && link->requester_channels + link->pending_reverse < kMaxRequesterChannels) {
      // Only the opener can connect; ask it for another reverse channel over the control link.
      ++link->pending_reverse;
      g.unlock();
      link->SendCtrl(kOpenReverse, deadline);
      g.lock();
    }
    const int64_t left = deadline - NowNs();
    if (left <= 0) {
      *st = LLM_TIMEOUT;
      return -1;
    }
    link->cv.wait_for(g, std::chrono::nanoseconds(left));
  }
}

void Impl::ReleaseChannel(const std::shared_ptr<struct Link> &link, int fd, bool reusable) {
  {
    std::lock_guard<std::mutex> g(link->mu);
    if (reusable && link->alive.load()) {
      link->idle.push_back(fd);
      link->cv.notify_one();
      return;
    }
    --link->requester_channels;
  }
  link->ForgetFd(fd);
}

// ------------------------------------------------------------------ server side
void Impl::HandleAccepted(int fd) {
  const int64_t deadline = NowNs() + kHandshakeNs;
  auto drop = [&] {
    {
      std::lock_guard<std::mutex> g(workers_mu_);
      loose_fds_.erase(fd);
    }
    close(fd);
  };
  FrameHeader h;
  std::string hello;
  if (RecvHeader(fd, &h, deadline) != IoResult::kOk || h.type != kHello || h.length > kMaxHelloBytes ||
      !ReadPayload(fd, h, &hello, deadline)) {
    SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + 100000000);
    return drop();
  }
  Reader r{reinterpret_cast<const uint8_t *>(hello.data()), hello.size()};
  const uint32_t version = r.Get<uint32_t>();
  const uint32_t kind = r.Get<uint32_t>();
  const uint64_t peer_cluster = r.Get<uint64_t>();
  const uint8_t *cn = r.Bytes(16);
  const uint8_t *tok = r.Bytes(16);
  if (!r.ok || version != kProtocolVersion || kind < 1 || kind > 3) {
    SendFrame(fd, kError, LLM_PARAM_INVALID, nullptr, 0, NowNs() + 100000000);
    return drop();
  }
  uint8_t ch[50] = {};
  RandomBytes(ch, 16);
  ch[16] = auth_token_.empty() ? 0 : 1;
  if (!auth_token_.empty()) {
    ch[17] = 1;
    Proof(auth_token_, "kvblocks-server", cn, ch, ch + 18);
  }
  std::string auth;
  if (SendFrame(fd, kChallenge, 0, ch, sizeof(ch), deadline) != IoResult::kOk ||
      RecvHeader(fd, &h, deadline) != IoResult::kOk || h.type != kAuth || h.length != 33 ||
      !ReadPayload(fd, h, &auth, deadline))
    return drop();
  if (!auth_token_.empty()) {
    uint8_t expect[32];
    Proof(auth_token_, "kvblocks-client", cn, ch, expect);
    if (auth[0] != 1 || !ConstantTimeEqual(expect, reinterpret_cast<const uint8_t *>(auth.data()) + 1, 32)) {
      LogWarn("rejected a link from cluster %llu: %s kvblocks.AuthToken",
              static_cast<unsigned long long>(peer_cluster), auth[0] == 1 ? "wrong" : "missing");
      SendFrame(fd, kHelloAck, LLM_LINK_FAILED, nullptr, 0, deadline);
      return drop();
    }
  }

  if (kind != static_cast<uint32_t>(ConnKind::kCtrl)) {
    auto link = FindLink(peer_cluster);
    if (!link || !link->alive.load() || !ConstantTimeEqual(link->token, tok, 16)) {
      SendFrame(fd, kHelloAck, LLM_NOT_YET_LINK, nullptr, 0, deadline);
      return drop();
    }
    if (SendFrame(fd, kHelloAck, LLM_SUCCESS, nullptr, 0, deadline) != IoResult::kOk) return drop();
    {
      std::lock_guard<std::mutex> g(workers_mu_);
      loose_fds_.erase(fd);
    }
    link->AddFd(fd);
    if (kind == static_cast<uint32_t>(ConnKind::kDataFwd)) {
      ServeConnection(fd, link);
    } else {
      std::lock_guard<std::mutex> g(link->mu);
      link->idle.push_back(fd);
      ++link->requester_channels;
      if (link->pending_reverse > 0) --link->pending_reverse;
      link->cv.notify_all();
    }
    return;
  }

  // Control connection: identity, clock, cache tables, then a confirm that registers the link.
  auto link = std::make_shared<struct Link>();
  link->remote_cluster_id = peer_cluster;
  if (!GetIdentity(&r, &link->peer)) return drop();
  const int64_t peer_t0 = r.Get<int64_t>();
  if (!r.ok || !ParseCacheTable(r.p + r.off, r.n - r.off, &link->caches)) {
    SendFrame(fd, kHelloAck, LLM_PARAM_INVALID, nullptr, 0, deadline);
    return drop();
  }
  (void)peer_t0;
  {
    auto existing = FindLink(peer_cluster);
    if (peer_cluster == cluster_id_ || (existing && existing->alive.load())) {
      SendFrame(fd, kHelloAck, peer_cluster == cluster_id_ ? LLM_PARAM_INVALID : LLM_ALREADY_LINK, nullptr, 0,
                deadline);
      return drop();
    }
  }
  RandomBytes(link->token, 16);
  PeerIdentity me;
  FillIdentity(&me);
  Writer w;
  w.Put<uint64_t>(cluster_id_);
  PutIdentity(&w, me);
  w.Put<int64_t>(NowNs());
  w.PutBytes(link->token, 16);
  std::string table;
  SnapshotCaches(&table);
  w.PutBytes(table.data(), table.size());
  std::string confirm;
  if (SendFrame(fd, kHelloAck, LLM_SUCCESS, w.buf.data(), w.buf.size(), deadline) != IoResult::kOk ||
      RecvHeader(fd, &h, deadline) != IoResult::kOk || h.type != kConfirm || h.length != 8 ||
      !ReadPayload(fd, h, &confirm, deadline))
    return drop();
  memcpy(&link->clock_offset_ns, confirm.data(), 8);
  ResolvePaths(link.get());
  Status st = LLM_SUCCESS;
  if (transport_ == "shm" && !link->same_host) st = LLM_LINK_FAILED;
  {
    std::lock_guard<std::mutex> g(links_mu_);
    auto it = links_.find(peer_cluster);
    if (stopping_.load()) {
      st = LLM_LINK_FAILED;
    } else if (it != links_.end() && it->second->alive.load()) {
      st = LLM_ALREADY_LINK;
    } else if (st == LLM_SUCCESS) {
      if (it != links_.end()) FailLink(it->second);
      link->ctrl_fd = fd;
      links_[peer_cluster] = link;
    }
  }
  if (SendFrame(fd, kConfirmAck, st, nullptr, 0, deadline) != IoResult::kOk || st != LLM_SUCCESS) {
    if (st == LLM_SUCCESS) {
      {
        std::lock_guard<std::mutex> g(link->ctrl_write_mu);
        link->ctrl_fd = -1;  // the fd is closed by drop() below; no writer may use it after
      }
      DropLink(link, true);
    }
    return drop();
  }
  {
    std::lock_guard<std::mutex> g(workers_mu_);
    loose_fds_.erase(fd);
  }
  link->AddFd(fd);
  CtrlLoop(link);
}

void Impl::CtrlLoop(std::shared_ptr<struct Link> link) {
  const int fd = link->ctrl_fd;
  for (;;) {
    FrameHeader h;
    std::string payload;
    if (RecvHeader(fd, &h, 0) != IoResult::kOk || !ReadPayload(fd, h, &payload, NowNs() + kHandshakeNs)) break;
    if (h.type == kUnlink) {
      link->SendCtrl(kUnlinkAck, NowNs() + 1000000000LL);
      DropLink(link, true);
      break;
    }
    if (h.type == kUnlinkAck) {
      std::lock_guard<std::mutex> g(link->mu);
      link->unlink_acked = true;
      link->cv.notify_all();
    } else if (h.type == kCacheGone && payload.size() == 8) {
      int64_t id;
      memcpy(&id, payload.data(), 8);
      auto it = link->caches.find(id);
      if (it != link->caches.end()) {
        std::unique_lock<std::shared_mutex> g(it->second.live->mu);  // waits for transfers using it
        it->second.live->gone = true;
      }
      link->SendCtrl(kCacheGoneAck, NowNs() + kHandshakeNs, &id, sizeof(id));
    } else if (h.type == kCacheGoneAck && payload.size() == 8) {
      int64_t id;
      memcpy(&id, payload.data(), 8);
      std::lock_guard<std::mutex> g(link->mu);
      link->gone_acked.insert(id);
      link->cv.notify_all();
    } else if (h.type == kOpenReverse && link->opener) {
      {
        // A peer may not make us open (and serve) more channels than it could use.
        std::lock_guard<std::mutex> g(link->mu);
        if (link->reverse_channels >= kMaxRequesterChannels) continue;
        ++link->reverse_channels;
      }
      Spawn([this, link] {
        Status st;
        const int rev = OpenChannel(link, ConnKind::kDataRev, NowNs() + kHandshakeNs, &st);
        if (rev >= 0) ServeConnection(rev, link);
        std::lock_guard<std::mutex> g(link->mu);
        --link->reverse_channels;
      });
    }
  }
  // The peer closed the control connection (exit, crash, unlink or finalize): the link is gone.
  if (link->alive.load()) LogInfo("link to cluster %llu lost", static_cast<unsigned long long>(link->remote_cluster_id));
  FailLink(link);
  link->CloseCtrl();
}

}  // namespace kvblocks
