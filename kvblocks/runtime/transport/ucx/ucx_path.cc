// SPDX-License-Identifier: Apache-2.0
// The UCX transport, runtime side (see ucx_path.h). Everything UCX lives in the plugin, loaded with
// dlopen() here on first need (transport/plugin.h); this file only speaks the plain-C backend ABI
// (transport/backend_abi.h).
#include "transport/ucx/ucx_path.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "transport/memory.h"
#include "common/error.h"
#include "common/util.h"
#include "kvblocks/ext_types.h"
#include "transport/backend.h"
#include "transport/backend_abi.h"
#include "transport/path.h"
#include "transport/peer.h"
#include "transport/plugin.h"
#include "transport/registry.h"
#include "transport/ucx/ucx_info.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

std::once_flag g_load_once;
const kvb_backend_api *g_api = nullptr;
std::string g_why;

// The plugin beside this library: site-packages/kvblocks/ -> site-packages/kvblocks_ucx/.
std::string DefaultPluginPath() { return RuntimeDir() + "/../kvblocks_ucx/libkvblocks_ucx.so"; }

// KVBLOCKS_UCX_LIBDIR: a UCX installation (a system one with verbs, say) whose libraries are loaded
// first, so the plugin binds to them instead of the libucx-cu12 wheel's.
bool PreloadUcx(std::string *why) {
  const char *dir = getenv("KVBLOCKS_UCX_LIBDIR");
  if (dir == nullptr || *dir == '\0') return true;
  for (const char *lib : {"libucs.so.0", "libuct.so.0", "libucp.so.0"}) {
    const std::string path = std::string(dir) + "/" + lib;
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char *e = dlerror();
      *why = "KVBLOCKS_UCX_LIBDIR: " + (e != nullptr ? std::string(e) : path);
      return false;
    }
  }
  return true;
}

void Load() {
  const char *env = getenv("KVBLOCKS_UCX_PLUGIN");
  const std::string path = env != nullptr && *env != '\0' ? std::string(env) : DefaultPluginPath();
  if (env != nullptr && strcmp(env, "off") == 0) {
    g_why = "KVBLOCKS_UCX_PLUGIN=off";
    LogInfo("UCX transport disabled (%s)", g_why.c_str());
    return;
  }
  if (!PreloadUcx(&g_why)) {
    LogWarn("UCX transport not loaded: %s", g_why.c_str());
    return;
  }
  bool present = false;
  const kvb_backend_api *api = LoadBackendPlugin(path, "ucx", &g_why, &present);
  if (api == nullptr) {
    // An absent extra is the normal case (auto stays on kvblocks' own paths); a broken one is not.
    if (!present) {
      g_why = "cannot load the UCX plugin (install kvblocks-ucx: pip install ./ucx in a checkout): " + g_why;
      LogInfo("UCX transport not loaded: %s", g_why.c_str());
    } else {
      if (g_why.find("not a kvblocks") != std::string::npos) g_why += " (reinstall kvblocks-ucx from ucx/)";
      LogWarn("UCX transport not loaded: %s", g_why.c_str());
    }
    return;
  }
  g_api = api;
  LogInfo("UCX transport loaded: UCX %s (%s)", api->version(), path.c_str());
  if (getenv("UCX_RNDV_THRESH") != nullptr)  // the plugin keeps puts emulated (ucx_plugin.cc)
    LogWarn("UCX_RNDV_THRESH is ignored: zero-copy puts crash UCX when a timed-out endpoint is closed");
}

const kvb_backend_api *Api() {
  std::call_once(g_load_once, Load);
  return g_api;
}

}  // namespace

// ------------------------------------------------------------------ context, registrations
class UcxContext {
 public:
  explicit UcxContext(kvb_ctx *c) : c_(c) {
    address_.resize(Api()->address(c_, nullptr, 0));
    Api()->address(c_, &address_[0], address_.size());
  }
  ~UcxContext() { Api()->destroy(c_); }
  kvb_ctx *get() const { return c_; }
  const std::string &address() const { return address_; }

 private:
  kvb_ctx *c_;
  std::string address_;
};

struct UcxRegistration {
  std::shared_ptr<UcxContext> ctx;  // outlives every mapping made on it
  std::vector<kvb_mem *> mems;
  std::vector<std::string> rkeys;
  std::vector<uint32_t> key_of;  // per tensor
  ~UcxRegistration() {
    for (kvb_mem *m : mems) Api()->mem_unmap(m);
  }
};

bool UcxAvailable(std::string *why) {
  const bool ok = Api() != nullptr;
  if (!ok && why != nullptr) *why = g_why;
  return ok;
}

namespace {

// Entries of a sysfs directory (not . and ..).
std::vector<std::string> Entries(const std::string &dir) {
  std::vector<std::string> out;
  DIR *d = opendir(dir.c_str());
  for (dirent *e; d != nullptr && (e = readdir(d)) != nullptr;)
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  if (d != nullptr) closedir(d);
  return out;
}

// The interface carrying IPv4 address `a`; "" when none.
std::string InterfaceOf(const in_addr &a) {
  ifaddrs *all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  std::string name;
  for (ifaddrs *i = all; i != nullptr && name.empty(); i = i->ifa_next)
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr.s_addr == a.s_addr)
      name = i->ifa_name;
  freeifaddrs(all);
  return name;
}

}  // namespace

std::string UcxDevicesOf(int fd, std::string *why) {
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&me), &len) != 0 || me.sin_family != AF_INET) {
    *why = "the link's local address is unknown";
    return "";
  }
  std::string devs = InterfaceOf(me.sin_addr);
  if (devs.empty()) {
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &me.sin_addr, ip, sizeof(ip));
    *why = std::string("no interface carries the link's address ") + ip;
    return "";
  }
  // RoCE / IPoIB: UCX names the RDMA device behind the interface by its own name and port.
  const std::string ib = "/sys/class/net/" + devs + "/device/infiniband";
  for (const std::string &dev : Entries(ib))
    for (const std::string &port : Entries("/sys/class/infiniband/" + dev + "/ports")) devs += "," + dev + ":" + port;
  return devs;
}

std::shared_ptr<UcxContext> MakeUcxContext(const std::string &devices, std::string *why) {
  if (!UcxAvailable(why)) return nullptr;
  char err[256] = {};
  if (getenv("UCX_NET_DEVICES") != nullptr) LogWarn("UCX_NET_DEVICES is ignored: the worker uses %s", devices.c_str());
  kvb_ctx *c = Api()->create(devices.c_str(), err, sizeof(err));
  if (c == nullptr) {
    *why = std::string("UCX set-up failed: ") + err;
    LogWarn("%s", why->c_str());
    return nullptr;
  }
  return std::make_shared<UcxContext>(c);
}

namespace {

std::string PackedRkey(kvb_mem *m) {
  std::string s(Api()->mem_rkey(m, nullptr, 0), '\0');
  Api()->mem_rkey(m, &s[0], s.size());
  return s;
}

// One mapping for an allocated cache's region, else one per tensor (user memory may lie anywhere).
std::shared_ptr<UcxRegistration> Register(const std::shared_ptr<UcxContext> &ctx, const LocalMemory &e) {
  auto r = std::make_shared<UcxRegistration>();
  r->ctx = ctx;
  char err[256] = {};
  auto map = [&](void *addr, size_t len) {
    kvb_mem *m = Api()->mem_map(ctx->get(), addr, len, static_cast<uint32_t>(e.mem.kind), e.mem.device, err,
                                 sizeof(err));
    if (m == nullptr) return false;
    r->mems.push_back(m);
    r->rkeys.push_back(PackedRkey(m));
    return true;
  };
  if (e.region) {
    if (!map(e.region->base, e.region->size)) r.reset();
    if (r) r->key_of.assign(e.num_tensors, 0);
  } else {
    for (uint32_t i = 0; i < e.num_tensors && r; ++i) {
      if (!map(e.tensor(i), e.tensor_bytes)) r.reset();
      if (r) r->key_of.push_back(i);
    }
  }
  if (!r) LogWarn("cache %lld stays off UCX: %s", static_cast<long long>(e.id), err);
  return r;
}

}  // namespace

Backend *UcxBackend();

namespace {

constexpr uint64_t kCapUcx = 1 << 7;  // the handshake bit (docs/protocol.md)

// The engine's worker: made on its first UCX link, on the interface of that link's control
// connection (an acceptor's: its listen address); it stays there for later links.
class UcxEngine : public EngineState {
 public:
  std::shared_ptr<UcxContext> Context(int fd, std::string *why) {
    std::lock_guard<std::mutex> g(mu_);
    if (ctx_) return ctx_;
    const std::string devices = UcxDevicesOf(fd, why);
    if (!devices.empty()) ctx_ = MakeUcxContext(devices, why);
    return ctx_;
  }

 private:
  std::mutex mu_;
  std::shared_ptr<UcxContext> ctx_;  // gone once the engine and the last endpoint and registration let go
};

// Registers `cache` with the worker (once; the registration lives as long as the cache, or until
// Unregister) and gives its keys for UCX_INFO; false when it stays off UCX.
bool Announce(const std::shared_ptr<UcxContext> &ctx, LocalMemory *cache, const TableEntry &shown, UcxCacheKeys *out) {
  std::shared_ptr<UcxRegistration> r;
  {
    std::lock_guard<std::mutex> g(cache->regs_mu);
    std::shared_ptr<void> &slot = cache->regs[UcxBackend()];
    if (!slot && !cache->closing.load()) slot = Register(ctx, *cache);
    r = std::static_pointer_cast<UcxRegistration>(slot);
  }
  if (!r || r->ctx != ctx || shown.addrs.empty()) return false;
  *out = UcxCacheKeys{shown.id, r->rkeys, r->key_of};
  return true;
}

void Forget(LocalMemory *cache) {
  std::shared_ptr<void> r;  // unmapped here, outside the lock
  std::lock_guard<std::mutex> g(cache->regs_mu);
  auto it = cache->regs.find(UcxBackend());
  if (it == cache->regs.end()) return;
  r.swap(it->second);
  cache->regs.erase(it);
}

// What the peer's UCX_INFO taught us: its worker address and its caches' keys, by cache id.
struct UcxLearned : PeerState {
  std::string worker;
  std::map<int64_t, UcxCacheKeys> caches;
};

}  // namespace

// ------------------------------------------------------------------ endpoint, path
// The endpoint to one peer's worker: the backend's state on that link.
class UcxPeer : public PeerState, public std::enable_shared_from_this<UcxPeer> {
 public:
  UcxPeer(std::shared_ptr<UcxContext> ctx, kvb_ep *ep, std::shared_ptr<const UcxLearned> learned)
      : ctx_(std::move(ctx)), ep_(ep), learned_(std::move(learned)) {}
  ~UcxPeer() override { Api()->close(ep_); }
  kvb_ep *ep() const { return ep_; }
  const std::shared_ptr<UcxContext> &ctx() const { return ctx_; }
  const UcxCacheKeys *KeysOf(int64_t cache_id) const {
    auto it = learned_->caches.find(cache_id);
    return it == learned_->caches.end() ? nullptr : &it->second;
  }

 private:
  std::shared_ptr<UcxContext> ctx_;
  kvb_ep *ep_;
  std::shared_ptr<const UcxLearned> learned_;  // the peer's worker (the endpoint's) and keys
};

namespace {

int LinkUp(void *link) { return static_cast<PeerLink *>(link)->alive.load() ? 1 : 0; }

class UcxPath : public Path {
 public:
  UcxPath(std::shared_ptr<UcxPeer> peer, PeerLink *link, std::vector<kvb_rkey *> rkeys, const RemoteCache &rc,
          const UcxCacheKeys &keys)
      : peer_(std::move(peer)), link_(link), rkeys_(std::move(rkeys)), remote_(rc.addrs), key_of_(keys.key_of) {}
  ~UcxPath() override {
    for (kvb_rkey *k : rkeys_) Api()->rkey_destroy(k);
  }
  const char *name() const override { return "ucx"; }
  PathMode mode() const override { return PathMode::kRemoteDma; }

  // One operation per merged run of each tensor pair; the ranges were checked against both
  // tables (engine/transfer.cc) before this is called.
  Status Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) override {
    const std::shared_ptr<UcxRegistration> mine = LocalMappings(local);  // held: mapped until we return
    std::vector<kvb_op> ops;
    ops.reserve(plan.src_tensors.size() * plan.segs.size());
    for (size_t i = 0; i < plan.src_tensors.size(); ++i) {
      const uint32_t lt = pull ? plan.dst_tensors[i] : plan.src_tensors[i];
      const uint32_t rt = pull ? plan.src_tensors[i] : plan.dst_tensors[i];
      const uint32_t lmem = mine ? mine->key_of[lt] : KVB_NO_MEM;
      for (const Segment &g : plan.segs) {
        const uint64_t loff = pull ? g.dst_off : g.src_off, roff = pull ? g.src_off : g.dst_off;
        ops.push_back(kvb_op{local.addrs[lt] + loff, remote_[rt] + roff, g.len, key_of_[rt], lmem});
      }
    }
    char err[256] = {};
    kvb_mem *const *lmems = mine ? mine->mems.data() : nullptr;
    const int r = Api()->run(peer_->ep(), rkeys_.data(), rkeys_.size(), lmems, mine ? mine->mems.size() : 0, ops.data(),
                             ops.size(), pull ? 1 : 0, deadline, LinkUp, link_, err, sizeof(err));
    if (r == KVB_OK) return LLM_SUCCESS;
    if (r == KVB_TIMEOUT) return LLM_TIMEOUT;
    return Fail(LLM_LINK_FAILED, "UCX %s to cluster %llu failed: %s", pull ? "get" : "put",
                static_cast<unsigned long long>(link_->remote_cluster_id),
                r == KVB_ABORTED ? "the link went down" : err);
  }

 private:
  // The local cache's mappings on this path's context, when it has been announced (else UCX finds
  // or makes its own).
  std::shared_ptr<UcxRegistration> LocalMappings(const LocalMemory &local) const {
    std::lock_guard<std::mutex> g(local.regs_mu);
    auto it = local.regs.find(UcxBackend());
    auto r = it == local.regs.end() ? nullptr : std::static_pointer_cast<UcxRegistration>(it->second);
    return r && r->ctx == peer_->ctx() ? r : nullptr;
  }

  std::shared_ptr<UcxPeer> peer_;
  PeerLink *link_;  // owns this path
  std::vector<kvb_rkey *> rkeys_;
  std::vector<uint64_t> remote_;
  std::vector<uint32_t> key_of_;
};

// The peer's rkeys for one cache; empty when any fails to unpack.
std::vector<kvb_rkey *> Unpack(kvb_ep *ep, const UcxCacheKeys &keys) {
  std::vector<kvb_rkey *> out;
  for (const std::string &k : keys.rkeys) {
    kvb_rkey *h = Api()->rkey_unpack(ep, k.data(), k.size());
    if (h == nullptr) {
      for (kvb_rkey *x : out) Api()->rkey_destroy(x);
      return {};
    }
    out.push_back(h);
  }
  return out;
}

// OPTION_UCX_TRUSTED_NETWORK=1: one-sided RMA over the network allowed (CheckOptions refuses any
// value but 0 and 1).
bool TrustedNetwork(const BackendOptions &o) { return o.Get(OPTION_UCX_TRUSTED_NETWORK) == "1"; }

// Attaches after CONFIRM, from the peer's UCX_INFO (AttachAfterConfirm), never at ChoosePaths.
class Ucx : public Backend {
 public:
  const char *name() const override { return "ucx"; }
  uint64_t capability() const override { return kCapUcx; }
  PathMode path_mode() const override { return PathMode::kRemoteDma; }
  const char *transport_option() const override { return "ucx"; }
  // auto offers UCX (for peers on other hosts) only on a trusted network, without integrity checks
  // (one-sided RMA is never checked) and when the plugin loads; loading it is its first use.
  bool Offered(const BackendOptions &o) const override {
    return o.transport == "ucx" || (o.transport == "auto" && TrustedNetwork(o) && !o.integrity && UcxAvailable());
  }
  bool Available(std::string *why) const override { return UcxAvailable(why); }
  Status CheckOptions(const BackendOptions &o) const override;
  void Unregister(LocalMemory *cache) override { Forget(cache); }
  bool Attach(PeerLink *, std::shared_ptr<PeerState> *) override { return false; }
  std::shared_ptr<Path> PathFor(PeerLink *link, PeerState *state, RemoteCache &rc) override {
    auto *peer = static_cast<UcxPeer *>(state);
    const UcxCacheKeys *keys = peer == nullptr ? nullptr : peer->KeysOf(rc.id);
    if (keys == nullptr) return nullptr;
    std::vector<kvb_rkey *> rkeys = Unpack(peer->ep(), *keys);
    if (rkeys.empty()) return nullptr;
    return std::make_shared<UcxPath>(peer->shared_from_this(), link, std::move(rkeys), rc, *keys);
  }

  bool ExchangesAttachData() const override { return true; }
  std::shared_ptr<EngineState> NewEngineState() const override { return std::make_shared<UcxEngine>(); }
  std::string AttachData(const AttachEnv &env, const std::vector<TableEntry> &shown, bool refuse) override;
  bool TakeAttachData(const PeerLink &link, const std::string &data, std::shared_ptr<PeerState> *learned) override;
  bool AttachAfterConfirm(const AttachEnv &env, PeerLink *link, std::shared_ptr<PeerState> learned, bool required,
                          std::string *why) override;
};

// The worker itself starts with the first UCX link, bound to that link's interface. The checks run
// in this order (the first refusal is the one reported).
Status Ucx::CheckOptions(const BackendOptions &o) const {
  // One-sided RMA over the network serves any address to anyone reaching it (README, threat model).
  const std::string trusted = o.Get(OPTION_UCX_TRUSTED_NETWORK, "0");
  if (trusted != "0" && trusted != "1")
    return Fail(LLM_PARAM_INVALID, "option %s=\"%s\": use 0 or 1", OPTION_UCX_TRUSTED_NETWORK, trusted.c_str());
  const bool selected = o.transport == "ucx";
  // UCX moves bytes one-sided (RMA): no peer reads the source, so nothing could compute the CRC.
  if (o.integrity && selected)
    return Fail(LLM_PARAM_INVALID, "option %s=crc32c needs a served path: use %s=tcp or auto (UCX's one-sided RMA "
                "is never checked)", OPTION_INTEGRITY, OPTION_TRANSPORT);
  std::string why;
  if (selected && !TrustedNetwork(o))
    return Fail(LLM_PARAM_INVALID,
                "option %s=ucx needs %s=1: UCX's software RMA lets any host that reaches the worker read and "
                "write this whole process; use it only on a network you trust",
                OPTION_TRANSPORT, OPTION_UCX_TRUSTED_NETWORK);
  if (selected && !Available(&why)) return Fail(LLM_PARAM_INVALID, "option %s=ucx: %s", OPTION_TRANSPORT, why.c_str());
  // UCX's own transports would carry the blocks in clear.
  if (o.encryption == "tls" && (selected || TrustedNetwork(o)))
    return Fail(LLM_PARAM_INVALID, "option %s=tls cannot be used with UCX (%s=ucx or %s=1): UCX would carry the "
                "blocks unencrypted", OPTION_ENCRYPTION, OPTION_TRANSPORT, OPTION_UCX_TRUSTED_NETWORK);
  return LLM_SUCCESS;
}

// Our worker address and the rkeys of `shown` (our link-time table), for a peer that offered UCX and
// sent CONFIRM. Empty when `refuse` or when no worker could be made.
std::string Ucx::AttachData(const AttachEnv &env, const std::vector<TableEntry> &shown, bool refuse) {
  UcxInfo info;
  std::string why;
  auto *engine = static_cast<UcxEngine *>(env.engine.get());
  const std::shared_ptr<UcxContext> ctx = refuse || engine == nullptr ? nullptr : engine->Context(env.ctrl_fd, &why);
  for (const TableEntry &t : shown) {
    std::shared_ptr<LocalMemory> e = ctx ? env.find_cache(t.id) : nullptr;
    UcxCacheKeys k;
    if (!e || !Announce(ctx, e.get(), t, &k)) continue;
    info.worker = ctx->address();
    info.caches.push_back(std::move(k));
  }
  std::string out;
  Encode(info, &out);
  return out;
}

// The whole message is refused (nothing taken) when it is malformed, or names a cache the link-time
// table lacks, one without addresses, or with another tensor count.
bool Ucx::TakeAttachData(const PeerLink &link, const std::string &data, std::shared_ptr<PeerState> *learned) {
  UcxInfo info;
  if (!Decode(data, &info)) return false;
  for (const UcxCacheKeys &k : info.caches) {
    auto it = link.caches.find(k.cache_id);
    if (it == link.caches.end() || it->second.addrs.empty() || k.key_of.size() != it->second.num_tensors)
      return false;
  }
  if (info.worker.empty()) return true;  // no UCX from that side
  auto l = std::make_shared<UcxLearned>();
  l->worker = std::move(info.worker);
  for (UcxCacheKeys &k : info.caches) l->caches[k.cache_id] = std::move(k);
  *learned = std::move(l);
  return true;
}

// Transport=ucx: every cache the peer announced over UCX, and the link fails without it; auto: peers
// on other hosts, the caches still on a served path.
bool Ucx::AttachAfterConfirm(const AttachEnv &env, PeerLink *link, std::shared_ptr<PeerState> learned, bool required,
                             std::string *why) {
  if (!required && ((link->capabilities & kCapUcx) == 0 || link->same_host)) return true;
  auto *engine = static_cast<UcxEngine *>(env.engine.get());
  const std::shared_ptr<UcxContext> ctx = engine == nullptr ? nullptr : engine->Context(env.ctrl_fd, why);
  if (!ctx || (link->capabilities & kCapUcx) == 0) {
    if (ctx || why->empty()) *why = !ctx ? "UCX is not available here" : "the peer does not offer UCX";
    return false;
  }
  auto peer_info = std::static_pointer_cast<const UcxLearned>(learned);
  if (!peer_info || peer_info->caches.empty()) {
    *why = "the peer announced no cache over UCX";
    return link->caches.empty();  // nothing to reach: not a failure
  }
  // UCX parses the address itself and asserts (aborts) on some malformed ones: take only an address
  // of our own format version (the low nibble of its first byte), the cheapest check of a garbled one.
  const std::string &mine = ctx->address();
  const std::string &theirs = peer_info->worker;
  if (mine.empty() || ((theirs[0] ^ mine[0]) & 0x0f) != 0) {
    *why = "the peer's UCP worker address has another format version";
    return false;
  }
  char err[256] = {};
  kvb_ep *ep = Api()->connect(ctx->get(), theirs.data(), theirs.size(), err, sizeof(err));
  if (ep == nullptr) {
    *why = err;
    return false;
  }
  AttachLater(link, UcxBackend(), std::make_shared<UcxPeer>(ctx, ep, std::move(peer_info)), required);
  return true;
}

}  // namespace

Backend *UcxBackend() {
  static Ucx b;
  return &b;
}

}  // namespace kvblocks
