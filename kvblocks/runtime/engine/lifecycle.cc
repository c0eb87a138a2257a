// SPDX-License-Identifier: Apache-2.0
// Impl lifecycle: Initialize / Finalize / SetRole and the worker threads (the listener is link/listener.h).
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/util.h"
#include "engine/async.h"
#include "engine/checks.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/keys.h"
#include "engine/late.h"
#include "engine/layerwise.h"
#include "engine/notify.h"
#include "engine/options.h"
#include "link/listener.h"
#include "net/tls.h"
#include "transport/registry.h"
#include "transport/select.h"

namespace kvblocks {

namespace {
// Every runtime thread's name (/proc/<pid>/task/<tid>/comm; at most 15 characters).
constexpr char kThreadName[] = "kvblocks-rt";

// kvblocks.MaxLinks when not set: kDefaultMaxLinks, or fewer when the fd limit is low.
size_t DefaultMaxLinks() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return kDefaultMaxLinks;
  return std::max<size_t>(1, std::min<size_t>(kDefaultMaxLinks, rl.rlim_cur / kFdsPerLink));
}
}  // namespace

// What the listener asks of the engine: runtime threads, and the linker for each connection.
struct Impl::ListenHost final : ListenerHost {
  explicit ListenHost(Impl *impl) : impl_(impl) {}
  bool Spawn(std::function<void()> fn) override { return impl_->Spawn(std::move(fn)); }
  void Handshake(int fd) override { impl_->linker_.Accept(fd); }
  Impl *const impl_;
};

Impl::Impl(uint64_t cluster_id, LlmRole role) : cluster_id_(cluster_id), role_(role) {
  listen_host_ = std::make_unique<ListenHost>(this);
  listener_ = std::make_unique<Listener>(listen_host_.get(), &stopping_);
  RegisterInstance(linker_.instance_token());
  RegisterEngine(this);
  notify_ = std::make_unique<Notifier>(&links_);
  keys_ = std::make_unique<KeyRelease>(KeyRelease::Deps{
      &caches_, &links_, &table_mu_, &state_mu_, [this] { return initialized(); },
      [this](std::function<void()> fn) { return Spawn(std::move(fn)); },
      [this](int64_t id) { return RemoveCacheHeld(id); }});
  late_ = std::make_unique<LateCaches>(
      LateCaches::Deps{&caches_, &table_mu_, [this] { return initialized(); }, &wait_time_ms_});
  checks_ = std::make_unique<Checks>(CheckView{cluster_id_, &state_mu_, &initialized_, &role_, &role_check_,
                                               &wait_time_ms_, &caches_, &links_, late_.get()});
  exec_ = std::make_unique<Executor>(ExecView{&state_mu_, &initialized_, &wait_time_ms_, &stats_});
  async_ = std::make_unique<Async>(checks_.get(), exec_.get());
  layerwise_ = std::make_unique<LayerWise>(checks_.get(), exec_.get(), &wait_time_ms_);
  RegisterFrames();
}

void Impl::RegisterFrames() {
  using L = const std::shared_ptr<struct Link> &;
  using H = const FrameHeader &;
  using P = const std::string &;
  // The peer asks the opener for one more channel it may push to us on (Link::AcquireChannel).
  control_.On(kOpenReverse, [this](L link, H, P) {
    if (!link->opener) return true;
    {
      // A peer may not make us open (and serve) more channels than it could use.
      std::unique_lock<std::mutex> g(link->mu);
      if (link->reverse_channels >= kMaxRequesterChannels) {
        g.unlock();
        link->SendCtrl(kReverseRefused, NowNs() + kSecNs);  // so the peer stops counting on it
        return true;
      }
      ++link->reverse_channels;
    }
    const bool started = Spawn([this, link] {
      Status st;
      const int rev = linker_.OpenChannel(link, ConnKind::kDataRev, NowNs() + kHandshakeNs, &st);
      if (rev < 0) link->SendCtrl(kReverseRefused, NowNs() + kSecNs);
      if (rev >= 0) Serve(rev, link);
      std::lock_guard<std::mutex> g(link->mu);
      --link->reverse_channels;
    });
    if (!started) {
      {
        std::lock_guard<std::mutex> g(link->mu);
        --link->reverse_channels;
      }
      link->SendCtrl(kReverseRefused, NowNs() + kSecNs);
    }
    return true;
  });
  notify_->Register(&control_);
  keys_->Register(&control_);
  late_->Register(&control_);
}

Impl::~Impl() {
  UnregisterEngine(this);  // waits for a snapshot of this engine in progress
  Finalize();
  UnregisterInstance(linker_.instance_token());
}

namespace {
// kvblocks.Encryption: "none" (default) or "tls", with the token or the certificate files as keys.
// A backend that cannot honour it refuses it first (Backend::CheckOptions).
template <typename Get>
Status TlsOption(Get &get, const std::string &token, std::shared_ptr<TlsContext> *out) {
  std::string v;
  if (!get(OPTION_ENCRYPTION, &v) || v == "none") return LLM_SUCCESS;
  if (v != "tls") return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": use none or tls", OPTION_ENCRYPTION, v.c_str());
  TlsConfig cfg;
  cfg.token = token;
  get(OPTION_TLS_CERT_FILE, &cfg.cert);
  get(OPTION_TLS_KEY_FILE, &cfg.key);
  get(OPTION_TLS_CA_FILE, &cfg.ca);
  std::string why;
  *out = MakeTlsContext(cfg, &why);
  if (!*out) return Fail(LLM_PARAM_INVALID, "option %s=tls: %s", OPTION_ENCRYPTION, why.c_str());
  return LLM_SUCCESS;
}
}  // namespace

Status Impl::Initialize(const std::map<AscendString, AscendString> &options) {
  std::unique_lock<std::shared_mutex> lk(state_mu_);
  if (initialized()) {
    WarnIgnoredOptions(init_options_, options);  // CANN: success, new options ignored (spec 3.2)
    return LLM_SUCCESS;
  }
  WarnUnknownOptions(options);
  const int32_t role = static_cast<int32_t>(role_.load());
  if (role < 1 || role > 3) return Fail(LLM_PARAM_INVALID, "role %d is not PROMPT (1), DECODER (2) or MIX (3)", role);

  auto get = [&](const char *key, std::string *v) {
    auto it = options.find(AscendString(key));
    if (it == options.end()) return false;
    *v = it->second.GetString();
    return true;
  };
  std::string v;
  // Device id: required; one non-negative integer (one device per process, as CANN V2).
  if (!get(OPTION_DEVICE_ID, &v)) return Fail(LLM_PARAM_INVALID, "option %s is required", OPTION_DEVICE_ID);
  uint64_t dev;
  if (!ParseUint(v, 0x7FFFFFFF, &dev))
    return Fail(LLM_PARAM_INVALID, "option %s=\"%s\" is not an integer >= 0", OPTION_DEVICE_ID, v.c_str());

  std::string listen_ip;
  uint32_t listen_port = 0;
  const bool listen = get(OPTION_LISTEN_IP_INFO, &v);
  if (listen && (!ParseHostPort(v, &listen_ip, &listen_port) || listen_port > 65535))
    return Fail(LLM_PARAM_INVALID, "option %s=\"%s\" is not ip:port", OPTION_LISTEN_IP_INFO, v.c_str());
  if (get(OPTION_TRANSFER_BACKEND, &v) && v != "hixl")
    return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": only \"hixl\" is accepted", OPTION_TRANSFER_BACKEND, v.c_str());
  int64_t wait_ms = kDefaultWaitMs;
  if (get(OPTION_SYNC_CACHE_WAIT_TIME, &v)) {
    uint64_t ms;
    if (!ParseUint(v, 0x7FFFFFFF, &ms))
      return Fail(LLM_PARAM_INVALID, "option %s=\"%s\" is not a number of ms", OPTION_SYNC_CACHE_WAIT_TIME,
                  v.c_str());
    // CANN's digit check lets "0" through, and then every served transfer times out: refused here.
    if (ms == 0)
      return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": a 0 ms deadline fails every transfer; give at least 1 ms "
                  "(default %lld)", OPTION_SYNC_CACHE_WAIT_TIME, v.c_str(), static_cast<long long>(kDefaultWaitMs));
    wait_ms = static_cast<int64_t>(ms);
  }
  BackendOptions bo;  // what the backends decide on (transport/backend.h)
  for (const auto &kv : options) bo.given[kv.first.GetString()] = kv.second.GetString();
  if (get(OPTION_TRANSPORT, &v)) {
    if (!KnownTransport(v))
      return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": use %s", OPTION_TRANSPORT, v.c_str(), TransportChoices().c_str());
    bo.transport = v;
  }
  std::string token;
  if (!get(OPTION_AUTH_TOKEN, &token)) {
    const char *env = getenv("KVBLOCKS_AUTH_TOKEN");
    if (env != nullptr) token = env;
  }
  size_t max_links = DefaultMaxLinks(), per_peer = kDefaultMaxLinksPerPeer;
  for (auto opt : {std::make_pair(OPTION_MAX_LINKS, &max_links), std::make_pair(OPTION_MAX_LINKS_PER_PEER, &per_peer)}) {
    uint64_t n;
    if (!get(opt.first, &v)) continue;
    if (!ParseUint(v, 0x7FFFFFFF, &n) || n == 0)
      return Fail(LLM_PARAM_INVALID, "option %s=\"%s\" is not an integer >= 1", opt.first, v.c_str());
    *opt.second = n;
  }
  bool role_check = false;  // CANN V2: transfers do not depend on the role; "1" restores V1 roles
  if (get(OPTION_ROLE_CHECK, &v)) {
    if (v != "0" && v != "1") return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": use 0 or 1", OPTION_ROLE_CHECK, v.c_str());
    role_check = v == "1";
  }
  // The caller's side decides; a peer that cannot check is refused (the served backend's).
  if (get(OPTION_INTEGRITY, &v)) {
    if (v != "none" && v != "crc32c")
      return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": use none or crc32c", OPTION_INTEGRITY, v.c_str());
    bo.integrity = v == "crc32c";
  }
  get(OPTION_ENCRYPTION, &bo.encryption);  // its value is checked by TlsOption, after the backends'
  const Status backend_st = CheckBackendOptions(bo);
  if (backend_st != LLM_SUCCESS) return backend_st;
  std::shared_ptr<TlsContext> tls;
  const Status tls_st = TlsOption(get, token, &tls);
  if (tls_st != LLM_SUCCESS) return tls_st;
  stopping_.store(false);
  LinkerOptions lo;
  lo.tls = tls;
  lo.local_comm_res = options.count(AscendString(OPTION_LOCAL_COMM_RES)) != 0;
  lo.backends = bo;
  lo.auth_token = token;
  lo.max_links = max_links;
  lo.max_links_per_peer = per_peer;
  linker_.Configure(lo);
  wait_time_ms_ = wait_ms;
  role_check_ = role_check;
  if (listen) {
    const Status st = listener_->Start(listen_ip, listen_port);
    if (st != LLM_SUCCESS) return st;
  }
  init_options_ = OptionsCopy(options);
  initialized_.store(true, std::memory_order_release);
  if (listen) LogInfo("cluster %llu listens on %s", static_cast<unsigned long long>(cluster_id_), ListenAddress().c_str());
  return LLM_SUCCESS;
}

void Impl::Finalize() {
  if (!initialized()) return;
  // Wake everything first so in-flight calls fail fast, then wait for them to leave.
  stopping_.store(true);
  listener_->Stop();
  links_.ShutdownAll();
  listener_->WakeLoose();
  std::unique_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return;
  listener_->Stop();  // again: a SetRole that held the lock may have started a new listener
  initialized_.store(false, std::memory_order_release);
  ReapWorkers(true);
  for (auto &kv : links_.TakeAll()) kv.second->Fail();
  for (auto &kv : caches_.TakeAll()) RetireCache(kv.second.get());
  notify_->Clear();
  linker_.Finalize();
}

Status Impl::SetRole(LlmRole role, const std::map<AscendString, AscendString> &options) {
  std::unique_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "set_role: the engine is not initialized");
  const int32_t r = static_cast<int32_t>(role);
  if (r < 1 || r > 3) return Fail(LLM_PARAM_INVALID, "role %d is not PROMPT (1), DECODER (2) or MIX (3)", r);
  std::string ip;
  uint32_t port = 0;
  auto it = options.find(AscendString(OPTION_LISTEN_IP_INFO));
  const bool listen = it != options.end();
  if (listen && (!ParseHostPort(it->second.GetString(), &ip, &port) || port > 65535))
    return Fail(LLM_PARAM_INVALID, "option %s=\"%s\" is not ip:port", OPTION_LISTEN_IP_INFO,
                it->second.GetString());
  if (!links_.empty()) return Fail(LLM_EXIST_LINK, "set_role: unlink every cluster first");
  if (listen) {
    if (!listener_->ListeningOn(ip, port)) {
      listener_->Stop();
      ReapWorkers(false);
      const Status st = listener_->Start(ip, port);
      if (st != LLM_SUCCESS) return st;
    }
  } else {
    listener_->Stop();
  }
  role_.store(role);
  return LLM_SUCCESS;
}

std::string Impl::ListenAddress() { return listener_->Address(); }
void Impl::TrackLoose(int fd) { listener_->TrackLoose(fd); }
void Impl::ForgetLoose(int fd) { listener_->ForgetLoose(fd); }
bool Impl::LeavePreauth(int fd) { return listener_->LeavePreauth(fd); }

bool Impl::Spawn(std::function<void()> fn) {
  ReapWorkers(false);
  std::lock_guard<std::mutex> g(workers_mu_);
  workers_.emplace_back();
  Worker *w = &workers_.back();
  try {
    // The thread starts with every asynchronous signal blocked (see AsyncSignalsBlocked); the
    // caller's own mask is back when this scope ends.
    AsyncSignalsBlocked quiet;
    w->thread = std::thread([w, fn = std::move(fn)] {
      pthread_setname_np(pthread_self(), kThreadName);
      // A runtime thread must never take the process down (e.g. bad_alloc on a peer's request).
      try {
        fn();
      } catch (const std::exception &e) {
        LogWarn("runtime thread stopped: %s", e.what());
      } catch (...) {
        LogWarn("runtime thread stopped by an unknown exception");
      }
      w->done.store(true, std::memory_order_release);
    });
  } catch (const std::system_error &e) {
    LogWarn("cannot start a runtime thread: %s", e.what());
    workers_.pop_back();
    return false;
  }
  return true;
}

void Impl::ReapWorkers(bool all) {
  // With all=true, threads spawned while we join (a reverse channel opened by a ctrl thread)
  // are joined too, so loop until none is left. Joins happen outside the lock.
  for (;;) {
    std::list<Worker> finished;
    {
      std::lock_guard<std::mutex> g(workers_mu_);
      for (auto it = workers_.begin(); it != workers_.end();) {
        auto next = std::next(it);
        if (all || it->done.load(std::memory_order_acquire)) finished.splice(finished.end(), workers_, it);
        it = next;
      }
    }
    if (finished.empty()) return;
    for (auto &w : finished)
      if (w.thread.joinable()) w.thread.join();
    if (!all) return;
  }
}

}  // namespace kvblocks
