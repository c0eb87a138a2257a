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
#include <mutex>
#include <vector>

#include "cache/cache.h"
#include "common/error.h"
#include "common/util.h"
#include "link/link.h"
#include "transport/backend.h"
#include "transport/backend_abi.h"
#include "transport/path.h"
#include "transport/plugin.h"
#include "transport/registry.h"
#include "wire/messages.h"

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
std::shared_ptr<UcxRegistration> Register(const std::shared_ptr<UcxContext> &ctx, const CacheEntry &e) {
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

void UcxAnnounce(const std::shared_ptr<UcxContext> &ctx, CacheEntry *cache, TableEntry *entry) {
  std::shared_ptr<UcxRegistration> r;
  {
    std::lock_guard<std::mutex> g(cache->regs_mu);
    std::shared_ptr<void> &slot = cache->regs[UcxBackend()];
    if (!slot && !cache->closing.load()) slot = Register(ctx, *cache);
    r = std::static_pointer_cast<UcxRegistration>(slot);
  }
  if (!r || r->ctx != ctx || entry->addrs.empty()) return;
  entry->ucx_worker = ctx->address();
  entry->ucx_rkeys = r->rkeys;
  entry->ucx_key_of = r->key_of;
}

namespace {
void Forget(CacheEntry *cache) {
  std::shared_ptr<void> r;  // unmapped here, outside the lock
  std::lock_guard<std::mutex> g(cache->regs_mu);
  auto it = cache->regs.find(UcxBackend());
  if (it == cache->regs.end()) return;
  r.swap(it->second);
  cache->regs.erase(it);
}
}  // namespace

// ------------------------------------------------------------------ endpoint, path
// The endpoint to one peer's worker: the backend's state on that link.
class UcxPeer : public PeerState, public std::enable_shared_from_this<UcxPeer> {
 public:
  UcxPeer(std::shared_ptr<UcxContext> ctx, kvb_ep *ep, std::string worker)
      : ctx_(std::move(ctx)), ep_(ep), worker_(std::move(worker)) {}
  ~UcxPeer() override { Api()->close(ep_); }
  kvb_ep *ep() const { return ep_; }
  const std::shared_ptr<UcxContext> &ctx() const { return ctx_; }
  const std::string &worker() const { return worker_; }

 private:
  std::shared_ptr<UcxContext> ctx_;
  kvb_ep *ep_;
  std::string worker_;  // the peer's worker address the endpoint reaches
};

namespace {

int LinkUp(void *link) { return static_cast<Link *>(link)->alive.load() ? 1 : 0; }

class UcxPath : public Path {
 public:
  UcxPath(std::shared_ptr<UcxPeer> peer, Link *link, std::vector<kvb_rkey *> rkeys, const RemoteCache &rc)
      : peer_(std::move(peer)), link_(link), rkeys_(std::move(rkeys)), remote_(rc.addrs), key_of_(rc.ucx_key_of) {}
  ~UcxPath() override {
    for (kvb_rkey *k : rkeys_) Api()->rkey_destroy(k);
  }
  const char *name() const override { return "ucx"; }
  PathMode mode() const override { return PathMode::kRemoteDma; }

  // One operation per merged run of each tensor pair; the ranges were checked against both
  // tables (engine/transfer.cc) before this is called.
  Status Execute(const Plan &plan, const CacheEntry &local, bool pull, int64_t deadline) override {
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
  std::shared_ptr<UcxRegistration> LocalMappings(const CacheEntry &local) const {
    std::lock_guard<std::mutex> g(local.regs_mu);
    auto it = local.regs.find(UcxBackend());
    auto r = it == local.regs.end() ? nullptr : std::static_pointer_cast<UcxRegistration>(it->second);
    return r && r->ctx == peer_->ctx() ? r : nullptr;
  }

  std::shared_ptr<UcxPeer> peer_;
  Link *link_;  // owns this path
  std::vector<kvb_rkey *> rkeys_;
  std::vector<uint64_t> remote_;
  std::vector<uint32_t> key_of_;
};

// The peer's rkeys for one cache; empty when any fails to unpack.
std::vector<kvb_rkey *> Unpack(kvb_ep *ep, const RemoteCache &rc) {
  std::vector<kvb_rkey *> out;
  for (const std::string &k : rc.ucx_rkeys) {
    kvb_rkey *h = Api()->rkey_unpack(ep, k.data(), k.size());
    if (h == nullptr) {
      for (kvb_rkey *x : out) Api()->rkey_destroy(x);
      return {};
    }
    out.push_back(h);
  }
  return out;
}

}  // namespace

bool UcxTake(const UcxInfo &info, Link *link) {
  for (const UcxCacheKeys &k : info.caches) {
    auto it = link->caches.find(k.cache_id);
    if (it == link->caches.end() || it->second.addrs.empty() || k.key_of.size() != it->second.num_tensors)
      return false;
  }
  for (const UcxCacheKeys &k : info.caches) {
    RemoteCache &rc = link->caches.at(k.cache_id);
    rc.ucx_worker = info.worker;
    rc.ucx_rkeys = k.rkeys;
    rc.ucx_key_of = k.key_of;
  }
  return true;
}

bool UcxAttach(const std::shared_ptr<UcxContext> &ctx, Link *link, bool force, std::string *why) {
  if (!ctx || (link->capabilities & kCapUcx) == 0) {
    if (ctx || why->empty()) *why = !ctx ? "UCX is not available here" : "the peer does not offer UCX";
    return false;
  }
  const RemoteCache *first = nullptr;  // the descriptors came in the peer's UCX_INFO (UcxTake)
  for (const auto &kv : link->caches)
    if (!kv.second.ucx_key_of.empty() && (first = &kv.second) != nullptr) break;
  if (first == nullptr) {
    *why = "the peer announced no cache over UCX";
    return link->caches.empty();  // nothing to reach: not a failure
  }
  // UCX parses the address itself and asserts (aborts) on some malformed ones: take only an address
  // of our own format version (the low nibble of its first byte), the cheapest check of a garbled one.
  const std::string &mine = ctx->address();
  if (mine.empty() || ((first->ucx_worker[0] ^ mine[0]) & 0x0f) != 0) {
    *why = "the peer's UCP worker address has another format version";
    return false;
  }
  char err[256] = {};
  kvb_ep *ep = Api()->connect(ctx->get(), first->ucx_worker.data(), first->ucx_worker.size(), err, sizeof(err));
  if (ep == nullptr) {
    *why = err;
    return false;
  }
  AttachLater(link, UcxBackend(), std::make_shared<UcxPeer>(ctx, ep, first->ucx_worker), force);
  return true;
}

namespace {

// Attaches after CONFIRM, from the peer's UCX_INFO (UcxAttach), never at ChoosePaths.
class Ucx : public Backend {
 public:
  const char *name() const override { return "ucx"; }
  uint64_t capability() const override { return kCapUcx; }
  PathMode path_mode() const override { return PathMode::kRemoteDma; }
  // auto offers UCX (for peers on other hosts) only on a trusted network and when the plugin loads;
  // loading it is its first use. Transport=ucx is refused without a trusted network (lifecycle.cc).
  bool Offered(const OfferOptions &o) const override {
    return o.transport == "ucx" || (o.transport == "auto" && o.trusted_network && UcxAvailable());
  }
  bool Available(std::string *why) const override { return UcxAvailable(why); }
  void Unregister(CacheEntry *cache) override { Forget(cache); }
  bool Attach(Link *, std::shared_ptr<PeerState> *) override { return false; }
  std::shared_ptr<Path> PathFor(Link *link, PeerState *state, RemoteCache &rc) override {
    auto *peer = static_cast<UcxPeer *>(state);
    if (peer == nullptr || rc.ucx_key_of.empty() || rc.ucx_worker != peer->worker()) return nullptr;
    std::vector<kvb_rkey *> keys = Unpack(peer->ep(), rc);
    if (keys.empty()) return nullptr;
    return std::make_shared<UcxPath>(peer->shared_from_this(), link, std::move(keys), rc);
  }
};

}  // namespace

Backend *UcxBackend() {
  static Ucx b;
  return &b;
}

}  // namespace kvblocks
