// SPDX-License-Identifier: Apache-2.0
// Backend selection (transport/registry.h SelectPath) with stand-in backends: the first attached
// backend, in order of preference, that both sides offered, that serves both memory kinds and that
// reaches the cache gives the path, and the path knows its backend.
#include <memory>
#include <string>
#include <vector>

#include "transport/peer.h"
#include "transport/registry.h"
#include "unit.h"

using namespace kvblocks;  // NOLINT: test code

namespace {

class StandInPath : public Path {
 public:
  explicit StandInPath(const char *name, PathMode mode) : name_(name), mode_(mode) {}
  const char *name() const override { return name_; }
  PathMode mode() const override { return mode_; }
  llm_datadist::Status Execute(const Plan &, const LocalMemory &, bool, int64_t) override { return 0; }

 private:
  const char *name_;
  PathMode mode_;
};

// Reaches a cache when `reaches` says so; serves host to host, or host to `remote_kind`.
class StandIn : public Backend {
 public:
  StandIn(const char *name, uint64_t cap, PathMode mode, MemKind remote_kind = MemKind::kHost)
      : name_(name), cap_(cap), mode_(mode), remote_kind_(remote_kind) {}
  const char *name() const override { return name_; }
  uint64_t capability() const override { return cap_; }
  PathMode path_mode() const override { return mode_; }
  bool Serves(MemKind local, MemKind remote) const override {
    return local == MemKind::kHost && remote == remote_kind_;
  }
  const char *transport_option() const override { return name_; }
  bool Offered(const BackendOptions &) const override { return true; }
  bool Attach(PeerLink *, std::shared_ptr<PeerState> *) override { return true; }
  std::shared_ptr<Path> PathFor(PeerLink *, PeerState *, RemoteCache &rc) override {
    ++asked;
    return rc.id % reaches_every == 0 ? std::make_shared<StandInPath>(name_, mode_) : nullptr;
  }
  int asked = 0;
  int64_t reaches_every = 1;  // reaches caches whose id is a multiple

 private:
  const char *name_;
  uint64_t cap_;
  PathMode mode_;
  MemKind remote_kind_;
};

RemoteCache Cache(int64_t id, MemKind kind = MemKind::kHost) {
  TableEntry t;
  t.id = id;
  t.mem.kind = kind;
  return RemoteCache(t);
}

std::shared_ptr<Path> Select(const std::vector<Attached> &order, uint64_t caps, RemoteCache &rc) {
  return SelectPath(order, caps, MemKind::kHost, rc.mem.kind, nullptr, rc);
}

}  // namespace

TEST(select_takes_the_first_backend_in_order_of_preference) {
  StandIn fast("fast", 1, PathMode::kLocalCopy), served("served", 2, PathMode::kServed);
  const std::vector<Attached> order = {{&fast, nullptr}, {&served, nullptr}};
  RemoteCache rc = Cache(4);
  auto p = Select(order, 3, rc);
  CHECK(p && p->owner == &fast && p->mode() == PathMode::kLocalCopy);
  CHECK(served.asked == 0);  // never asked once a preferred one reached the cache
}

TEST(select_skips_a_backend_the_peer_did_not_offer) {
  StandIn fast("fast", 1, PathMode::kLocalCopy), served("served", 2, PathMode::kServed);
  const std::vector<Attached> order = {{&fast, nullptr}, {&served, nullptr}};
  RemoteCache rc = Cache(4);
  auto p = Select(order, 2, rc);  // only the served bit in both offers
  CHECK(p && p->owner == &served);
  CHECK(fast.asked == 0);
}

TEST(select_falls_through_when_a_backend_cannot_reach_the_cache) {
  StandIn fast("fast", 1, PathMode::kLocalCopy), rdma("rdma", 4, PathMode::kRemoteDma),
      served("served", 2, PathMode::kServed);
  fast.reaches_every = 2;  // only even ids (e.g. allocated caches with a memfd)
  const std::vector<Attached> order = {{&fast, nullptr}, {&rdma, nullptr}, {&served, nullptr}};
  RemoteCache even = Cache(2), odd = Cache(3);
  CHECK(Select(order, 7, even)->owner == &fast);
  auto p = Select(order, 7, odd);
  CHECK(p && p->owner == &rdma && p->mode() == PathMode::kRemoteDma);
  CHECK(fast.asked == 2 && rdma.asked == 1 && served.asked == 0);
}

TEST(select_needs_a_backend_that_serves_both_memory_kinds) {
  StandIn host("host", 1, PathMode::kLocalCopy), gpu("gpu", 2, PathMode::kLocalCopy, MemKind::kCuda);
  const std::vector<Attached> order = {{&host, nullptr}, {&gpu, nullptr}};
  RemoteCache on_gpu = Cache(1, MemKind::kCuda), on_host = Cache(1);
  CHECK(Select(order, 3, on_gpu)->owner == &gpu);
  CHECK(host.asked == 0);  // a host-only backend is never asked for device memory
  CHECK(Select(order, 3, on_host)->owner == &host);
  const std::vector<Attached> host_only = {{&host, nullptr}};
  CHECK(Select(host_only, 3, on_gpu) == nullptr);  // nothing serves it: no path, never a wrong one
}

TEST(select_with_nothing_attached_gives_no_path) {
  RemoteCache rc = Cache(1);
  CHECK(Select({}, ~uint64_t{0}, rc) == nullptr);
}
