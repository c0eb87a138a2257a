// SPDX-License-Identifier: Apache-2.0
// LinkLlmClusters / UnlinkLlmClusters and the accepting side of every connection.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "link/handshake.h"
#include "net/socket.h"
#include "transport/select.h"

namespace kvblocks {

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
  if (timeout_ms <= 0) return Fail(LLM_PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  for (size_t i = 0; i < clusters.size(); ++i) {
    for (const auto &ip : clusters[i].remote_ip_infos)
      if (!ValidIpv4(ip))
        return Fail(LLM_PARAM_INVALID, "clusters[%zu].remote_ip_infos: \"%s\" is not an IPv4 address", i,
                    ip.ip.GetString());
    if (check_local)
      for (const auto &ip : clusters[i].local_ip_infos)
        if (!ValidIpv4(ip))
          return Fail(LLM_PARAM_INVALID, "clusters[%zu].local_ip_infos: \"%s\" is not an IPv4 address", i,
                      ip.ip.GetString());
  }
  if (clusters.empty()) return Fail(LLM_PARAM_INVALID, "no clusters given");
  rets.assign(clusters.size(), LLM_SUCCESS);
  Status overall = LLM_SUCCESS;
  for (size_t i = 0; i < clusters.size(); ++i) {
    rets[i] = one(clusters[i]);
    if (rets[i] != LLM_SUCCESS) overall = rets[i];
  }
  return overall;
}
}  // namespace

void Impl::DropLink(const std::shared_ptr<struct Link> &link) {
  link->Fail();
  links_.Erase(link);
}

void Impl::FillLinkInfo(LinkInfo *info) {
  info->capabilities = OfferedCapabilities(transport_);
  FillIdentity(instance_token_, &probe_value_, &info->identity);
  info->clock_ns = NowNs();
  info->caches = caches_.Describe();
}

std::shared_ptr<struct Link> Impl::NewLink(uint64_t remote_cluster_id, const LinkInfo &info) {
  auto link = std::make_shared<struct Link>();
  link->remote_cluster_id = remote_cluster_id;
  link->peer = info.identity;
  link->capabilities = info.capabilities & OfferedCapabilities(transport_);
  for (const TableEntry &e : info.caches) link->caches.emplace(e.id, RemoteCache(e));
  PeerIdentity me;
  FillIdentity(instance_token_, &probe_value_, &me);
  ChoosePaths(link.get(), me);
  return link;
}

void Impl::ForgetLoose(int fd) {
  std::lock_guard<std::mutex> g(workers_mu_);
  loose_fds_.erase(fd);
}

// ------------------------------------------------------------------ opener side
int Impl::OpenChannel(const std::shared_ptr<struct Link> &link, ConnKind kind, int64_t deadline, Status *st) {
  const int fd = ConnectTcp(link->remote_ip, link->remote_port, deadline, st);
  if (fd < 0) return -1;
  Hello hello;
  hello.kind = kind;
  hello.cluster_id = cluster_id_;
  RandomBytes(hello.nonce, sizeof(hello.nonce));
  memcpy(hello.link_token, link->token, sizeof(hello.link_token));
  std::string ack;
  *st = ClientHandshake(fd, hello, auth_token_, deadline, &ack);
  if (*st != LLM_SUCCESS) {
    close(fd);
    return -1;
  }
  link->AddFd(fd);
  return fd;
}

Status Impl::LinkOne(const ClusterInfo &ci, int32_t timeout_ms) {
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * kMsNs;
  const unsigned long long want = ci.remote_cluster_id;
  if (ci.remote_ip_infos.size() != 1)
    return Fail(LLM_PARAM_INVALID, "cluster %llu: %zu remote_ip_infos (needs exactly 1)", want,
                ci.remote_ip_infos.size());
  if (!local_comm_res_ && ci.local_ip_infos.size() != 1)
    return Fail(LLM_PARAM_INVALID, "cluster %llu: %zu local_ip_infos (needs exactly 1, or set llm.LocalCommRes)",
                want, ci.local_ip_infos.size());
  const std::string ip = ci.remote_ip_infos[0].ip.GetString();
  const uint16_t port = ci.remote_ip_infos[0].port;
  if (links_.FindAlive(ci.remote_cluster_id)) return Fail(LLM_ALREADY_LINK, "cluster %llu is already linked", want);
  std::lock_guard<std::mutex> serial(linking_mu_);
  Status st;
  const int fd = ConnectTcp(ip, port, deadline, &st);
  if (fd < 0) return st == LLM_TIMEOUT ? LLM_TIMEOUT : LLM_LINK_FAILED;
  {
    std::lock_guard<std::mutex> g(workers_mu_);
    loose_fds_.insert(fd);
  }
  auto fail = [&](Status s) {
    ForgetLoose(fd);
    close(fd);
    return s;
  };
  Hello hello;
  hello.cluster_id = cluster_id_;
  RandomBytes(hello.nonce, sizeof(hello.nonce));
  FillLinkInfo(&hello.info);
  const int64_t t0 = hello.info.clock_ns;
  std::string payload;
  st = ClientHandshake(fd, hello, auth_token_, deadline, &payload);
  const int64_t t1 = NowNs();
  if (st != LLM_SUCCESS) return fail(st == LLM_ALREADY_LINK || st == LLM_TIMEOUT ? st : LLM_LINK_FAILED);
  HelloAck ack;
  if (!Decode(payload, &ack)) return fail(Fail(LLM_LINK_FAILED, "%s:%u sent a malformed HELLO_ACK", ip.c_str(), port));
  auto link = NewLink(ack.cluster_id, ack.info);
  memcpy(link->token, ack.link_token, sizeof(link->token));
  link->clock_offset_ns = ack.info.clock_ns - (t0 + (t1 - t0) / 2);
  link->opener = true;
  link->remote_ip = ip;
  link->remote_port = port;
  link->open_channel = [this, weak = std::weak_ptr<struct Link>(link)](ConnKind kind, int64_t dl, Status *s) {
    auto l = weak.lock();
    *s = LLM_NOT_YET_LINK;
    return l ? OpenChannel(l, kind, dl, s) : -1;
  };
  if (links_.FindAlive(link->remote_cluster_id))
    return fail(Fail(LLM_ALREADY_LINK, "cluster %llu is already linked", want));
  if (transport_ == "shm" && !link->same_host) {
    LogWarn("kvblocks.Transport=shm, but cluster %llu is on another host", want);
    return fail(Fail(LLM_LINK_FAILED, "kvblocks.Transport=shm, but cluster %llu is on another host", want));
  }
  FrameHeader h;
  std::string tmp;
  IoResult ir = SendMessage(fd, kConfirm, 0, Confirm{-link->clock_offset_ns}, deadline);
  if (ir == IoResult::kOk) ir = RecvHeader(fd, &h, deadline);
  if (ir != IoResult::kOk) return fail(ir == IoResult::kTimeout ? LLM_TIMEOUT : LLM_LINK_FAILED);
  if (h.type != kConfirmAck || RecvPayload(fd, h, &tmp, deadline) != IoResult::kOk) return fail(LLM_LINK_FAILED);
  if (h.status != LLM_SUCCESS) return fail(h.status);

  ForgetLoose(fd);
  link->ctrl_fd = fd;
  link->AddFd(fd);
  st = links_.Insert(link, stopping_);
  if (st != LLM_SUCCESS) {
    link->Fail();
    return st;
  }
  if (!Spawn([this, link] { CtrlLoop(link); })) {
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
  {
    std::lock_guard<std::mutex> g(link->mu);
    link->idle.push_back(fwd);
    link->requester_channels = 1;
    link->reverse_channels = 1;
  }
  Spawn([this, link, rev] { ServeConnection(rev, link); });
  LogInfo("linked to cluster %llu (%s)", want, link->PathName());
  return LLM_SUCCESS;
}

Status Impl::Link(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "link_llm_clusters: the engine is not initialized");
  return EachCluster(clusters, rets, timeout_ms, true, [&](const ClusterInfo &c) { return LinkOne(c, timeout_ms); });
}

Status Impl::UnlinkOne(const ClusterInfo &ci, int32_t timeout_ms, bool force) {
  if (!force && ci.remote_ip_infos.size() != 1)
    return Fail(LLM_PARAM_INVALID, "cluster %llu: %zu remote_ip_infos (needs exactly 1)",
                static_cast<unsigned long long>(ci.remote_cluster_id), ci.remote_ip_infos.size());
  auto link = links_.Find(ci.remote_cluster_id);
  if (!link) return LLM_SUCCESS;
  if (force || !link->alive.load()) {
    DropLink(link);
    return LLM_SUCCESS;
  }
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * kMsNs;
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
  DropLink(link);
  if (acked) return LLM_SUCCESS;
  return Fail(LLM_UNLINK_FAILED, "cluster %llu did not acknowledge the unlink",
              static_cast<unsigned long long>(ci.remote_cluster_id));
}

Status Impl::Unlink(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms,
                    bool force) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "unlink_llm_clusters: the engine is not initialized");
  return EachCluster(clusters, rets, timeout_ms, false,
                     [&](const ClusterInfo &c) { return UnlinkOne(c, timeout_ms, force); });
}

// ------------------------------------------------------------------ acceptor side
void Impl::HandleAccepted(int fd) {
  const int64_t deadline = NowNs() + kHandshakeNs;
  Hello hello;
  if (!ServerHandshake(fd, auth_token_, deadline, &hello)) {
    ForgetLoose(fd);
    close(fd);
    return;
  }
  if (hello.kind == ConnKind::kCtrl) {
    AcceptControl(fd, hello, deadline);
  } else {
    AcceptChannel(fd, hello, deadline);
  }
}

// A data channel of an existing link, proven by the link token.
void Impl::AcceptChannel(int fd, const Hello &hello, int64_t deadline) {
  auto link = links_.FindAlive(hello.cluster_id);
  const bool ok = link && ConstantTimeEqual(link->token, hello.link_token, sizeof(link->token));
  if (SendFrame(fd, kHelloAck, ok ? LLM_SUCCESS : LLM_NOT_YET_LINK, nullptr, 0, deadline) != IoResult::kOk || !ok) {
    ForgetLoose(fd);
    close(fd);
    return;
  }
  ForgetLoose(fd);
  link->AddFd(fd);
  if (hello.kind == ConnKind::kDataFwd) {
    ServeConnection(fd, link);
  } else {
    link->AddRequesterChannel(fd);
  }
}

// Control connection: identity, clock, cache tables, then a confirm that registers the link.
void Impl::AcceptControl(int fd, const Hello &hello, int64_t deadline) {
  auto drop = [&] {
    ForgetLoose(fd);
    close(fd);
  };
  const uint64_t peer = hello.cluster_id;
  if (peer == cluster_id_ || links_.FindAlive(peer)) {
    SendFrame(fd, kHelloAck, peer == cluster_id_ ? LLM_PARAM_INVALID : LLM_ALREADY_LINK, nullptr, 0, deadline);
    return drop();
  }
  auto link = NewLink(peer, hello.info);
  HelloAck ack;
  ack.cluster_id = cluster_id_;
  RandomBytes(link->token, sizeof(link->token));
  memcpy(ack.link_token, link->token, sizeof(ack.link_token));
  FillLinkInfo(&ack.info);
  FrameHeader h;
  std::string payload;
  Confirm confirm;
  if (SendMessage(fd, kHelloAck, LLM_SUCCESS, ack, deadline) != IoResult::kOk ||
      RecvHeader(fd, &h, deadline) != IoResult::kOk || h.type != kConfirm ||
      RecvPayload(fd, h, &payload, deadline) != IoResult::kOk || !Decode(payload, &confirm))
    return drop();
  link->clock_offset_ns = confirm.clock_offset_ns;
  Status st = transport_ == "shm" && !link->same_host ? LLM_LINK_FAILED : LLM_SUCCESS;
  if (st == LLM_SUCCESS) {
    link->ctrl_fd = fd;
    st = links_.Insert(link, stopping_);
    if (st != LLM_SUCCESS) link->ctrl_fd = -1;
  }
  if (SendFrame(fd, kConfirmAck, st, nullptr, 0, deadline) != IoResult::kOk || st != LLM_SUCCESS) {
    if (st == LLM_SUCCESS) {
      {
        std::lock_guard<std::mutex> g(link->ctrl_write_mu);
        link->ctrl_fd = -1;  // the fd is closed by drop() below; no writer may use it after
      }
      DropLink(link);
    }
    return drop();
  }
  ForgetLoose(fd);
  link->AddFd(fd);
  CtrlLoop(link);
}

void Impl::ServeConnection(int fd, std::shared_ptr<struct Link> link) { ServeChannel(fd, link.get(), caches_); }

}  // namespace kvblocks
