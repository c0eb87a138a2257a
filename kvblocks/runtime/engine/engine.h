// SPDX-License-Identifier: Apache-2.0
// The engine behind llm_datadist::LlmDataDist: options, lifecycle, and the registries (caches,
// links) it owns; the API calls' entry points. Its parts are their own classes, each seeing the
// engine through a narrow view: Checks (engine/checks.h: every transfer precondition in CANN's
// order), Executor (engine/executor.h: sync, detached, pipelined runs), Async (engine/async.h),
// LayerWise (engine/layerwise.h), Notifier, KeyRelease, LateCaches; the Linker, ControlChannel and
// Listener in link/. Concerns below live in their own folders (cache/, transport/, plan/, wire/,
// net/, security/).
#ifndef KVBLOCKS_RUNTIME_ENGINE_ENGINE_H_
#define KVBLOCKS_RUNTIME_ENGINE_ENGINE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.h"
#include "common/limits.h"
#include "kvblocks/ext.h"
#include "kvblocks/layout.h"
#include "kvblocks/rules.h"
#include "link/control.h"
#include "link/linker.h"
#include "link/registry.h"
#include "metrics/stats.h"
#include "transport/local_peer.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

using llm_datadist::Status;
using namespace llm_datadist;  // NOLINT: status constants and API types throughout the engine

struct Worker {
  std::thread thread;
  std::atomic<bool> done{false};
};

struct Transfer;
PreparedInfo DescribePrepared(const PreparedState &p);  // engine/prepared.cc
class Async;
class Executor;
class LayerWise;
class Notifier;
class KeyRelease;
class LateCaches;
class Listener;
class Checks;
class TlsContext;
struct TransferFree;  // engine/transfer.h
using TransferPtr = std::unique_ptr<Transfer, TransferFree>;

class Impl : private LinkerHost {
 public:
  Impl(uint64_t cluster_id, LlmRole role);
  ~Impl();

  Status Initialize(const std::map<AscendString, AscendString> &options);
  void Finalize();
  Status SetRole(LlmRole role, const std::map<AscendString, AscendString> &options);
  Status Link(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms);
  Status Unlink(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, int32_t timeout_ms, bool force);
  Status AddCache(const CacheDesc &desc, const std::vector<uint64_t> &addrs, CacheKind kind, int64_t key,
                  Cache *out, bool allocate);
  Status RemoveCache(int64_t cache_id);
  Status PullBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                    const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext);
  Status PushBlocks(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                    const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext);
  Status PullCache(const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                   const KvCacheExtParam &ext);
  Status PushCache(const Cache &src, const CacheIndex &dst, uint32_t src_batch_index, int64_t size,
                   const KvCacheExtParam &ext);
  Status CopyBlocks(const Cache &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                    const std::vector<std::vector<uint64_t>> &dst_lists);
  Status CopyCache(const Cache &src, const Cache &dst, uint32_t src_batch, uint32_t dst_batch, uint64_t offset,
                   int64_t size);

  // extensions
  Status FindRemoteCache(uint64_t cluster_id, int64_t key, int64_t *cache_id);
  Status DescribeRemoteCache(uint64_t cluster_id, int64_t cache_id, RemoteCacheInfo *out);
  std::string LinkPath(uint64_t cluster_id);
  std::shared_ptr<void> PinCacheMemory(int64_t cache_id);
  int LinkChannels(uint64_t cluster_id);
  // Why the last attempt to link to `cluster_id` failed; false when it succeeded or none was made.
  bool LastLinkFailure(uint64_t cluster_id, LinkFailure *out) { return linker_.LastLinkFailure(cluster_id, out); }
  // The address the listener is bound to ("ip:port", "[ip6]:port", with the port the kernel chose
  // for port 0), or "" when this engine does not listen.
  std::string ListenAddress();
  bool HasLinks() const { return !links_.empty(); }
  Status SetBatchKeys(int64_t cache_id, const std::vector<int64_t> &keys);
  Status FindRemoteKey(uint64_t cluster_id, int64_t key, int64_t *cache_id, uint32_t *batch_index);
  Status PullRowToBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &dst_blocks,
                         const KvCacheExtParam &ext);
  // keys.cc: CANN's key release (spec hixl.md 3.4), kept by the cache's owner.
  Status DeallocateWhenUnbound(int64_t cache_id, bool *deferred);
  Status UnbindKey(int64_t cache_id, int64_t key, bool *was_bound);
  Status ReleaseRemoteKey(uint64_t cluster_id, int64_t cache_id, int64_t key);
  // engine/async.h: asynchronous blocks transfers; every request is checked (as the synchronous call)
  // before any is submitted. `failed` is the index of the request that failed.
  Status SubmitBlocks(const BlocksRequest *reqs, size_t n, TransferHandle *out, size_t *failed);
  // engine/prepared.cc: a transfer checked and planned once, executed many times
  Status PrepareTransfer(const BlocksRequest &r, const LayoutTransform *xf, PreparedTransfer *out);
  Status ExecutePrepared(PreparedState &p);
  Status ExecutePreparedAsync(PreparedState &p, TransferHandle *out);
  // notify.cc: user notifications on a link's control connection (hixl's send_notify/get_notifies).
  // A notification follows every transfer on that link that returned (or completed) before it.
  Status SendNotify(uint64_t cluster_id, const std::string &name, const std::string &message, int32_t timeout_ms);
  Status GetNotifies(std::vector<NotifyMessage> *out);
  // ranges.cc: address-based transfers between memory registered here and memory the peer had
  // registered when the link was made (each registration a one-tensor cache). Every range is
  // checked against both before any byte moves. `timeout_ms` < 0: the engine's wait time.
  Status TransferRanges(uint64_t cluster_id, bool read, const AddrRange *ranges, size_t n, int64_t timeout_ms);
  Status SubmitRanges(uint64_t cluster_id, bool read, const AddrRange *ranges, size_t n, int64_t timeout_ms,
                      TransferHandle *out);
  // Links with the peer at ip:port (IPv4 or IPv6) whose cluster id must be `remote_cluster_id`.
  Status LinkAddress(uint64_t remote_cluster_id, const std::string &ip, uint16_t port, int32_t timeout_ms);
  Status UnlinkCluster(uint64_t remote_cluster_id, int32_t timeout_ms);
  // engine/layerwise.h: layer-wise pushes (include/kvblocks/layerwise.h).
  Status OpenLayerPush(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                       const std::vector<uint64_t> &dst_blocks, uint8_t tensor_num_per_layer, LayerPush *out);
  Status OpenLayerPushPieces(const Cache &src, uint64_t dst_cluster_id, uint32_t num_layers,
                             const std::vector<LayerPiece> &pieces, bool per_layer_deadline, LayerPush *out);
  // engine/async.h: one request, without copying its lists into a BlocksRequest (the fast path).
  Status SubmitOne(bool pull, const CacheIndex &remote, const Cache &local, const std::vector<uint64_t> &src_blocks,
                   const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext, TransferHandle *out);
  // engine/metrics.cc: this engine's counters now (include/kvblocks/metrics.h).
  void Metrics(EngineMetrics *out);
  bool Live() const { return initialized(); }  // initialized and not finalized: in kvblocks.metrics()

 private:
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  // lifecycle.cc
  void ReapWorkers(bool all);
  // links.cc: LinkerHost, what the linker (link/linker.h) asks of the engine
  std::vector<TableEntry> DescribeCaches() override;
  void AddMemfds(const std::vector<TableEntry> &shown, LocalFds *out, std::vector<std::shared_ptr<void>> *keep) override;
  std::shared_ptr<LocalMemory> OurCache(int64_t id) override;
  bool Spawn(std::function<void()> fn) override;  // lifecycle.cc
  void Serve(int fd, const std::shared_ptr<struct Link> &link) override;
  void TrackLoose(int fd) override;  // lifecycle.cc: the listener's
  void ForgetLoose(int fd) override;
  bool LeavePreauth(int fd) override;
  bool Running() const override;
  // lifecycle.cc: the engine's control frames into control_'s table (reverse channels, notify, keys,
  // late caches), once, at construction.
  void RegisterFrames();
  // ranges.cc
  Status PrepareRanges(Transfer *t, uint64_t cluster_id, bool read, const AddrRange *ranges, size_t n,
                       int64_t deadline);
  // engine/metrics.cc: counts a link attempt's end; returns st
  Status TallyLink(uint64_t cluster_id, Status st);
  // caches.cc
  Status NotifyCacheGone(int64_t cache_id, int64_t deadline);
  Status RemoveCacheHeld(int64_t cache_id);  // RemoveCache with state_mu_ already held shared

 public:
  const uint64_t cluster_id_;

 private:
  std::atomic<LlmRole> role_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> stopping_{false};
  std::shared_mutex state_mu_;  // API calls shared; Initialize/Finalize/SetRole exclusive

  // options
  int64_t wait_time_ms_ = kDefaultWaitMs;
  bool role_check_ = false;  // kvblocks.RoleCheck: "0" (default, CANN V2) or "1" (V1 roles)

  // Declared before the thread pools, which count the transfers they finish here.
  metrics::EngineStats stats_;
  CacheRegistry caches_;
  // Handshakes hold it shared from snapshotting our cache table until their link is registered;
  // unregister takes it once, exclusively, so every link that may have seen a cache is asked.
  std::shared_timed_mutex table_mu_;
  LinkRegistry links_;
  ControlChannel control_{&links_};  // every link's control loop; handlers registered at construction
  Linker linker_{cluster_id_, this, &links_, &control_, &stats_, &table_mu_, &stopping_};  // makes and ends links

  // llm.ListenIpInfo: accept loop, pre-auth slots (link/listener.h), and what it asks of us
  // (lifecycle.cc). Behind pointers, so a listener.h edit rebuilds only its includers.
  struct ListenHost;
  std::unique_ptr<ListenHost> listen_host_;
  std::unique_ptr<Listener> listener_;

  // runtime threads (Spawn), joined by ReapWorkers
  std::mutex workers_mu_;
  std::list<Worker> workers_;
  // The options of the Initialize that took effect: a second Initialize names those it ignores.
  std::map<std::string, std::string> init_options_;

  std::unique_ptr<Checks> checks_;    // engine/checks.h: every transfer precondition, in CANN's order
  std::unique_ptr<Notifier> notify_;  // engine/notify.h: send_notify / get_notifies
  std::unique_ptr<KeyRelease> keys_;  // engine/keys.h: CANN's key release
  std::unique_ptr<LateCaches> late_;  // engine/late.h: caches the peer registered after linking

  std::unique_ptr<Executor> exec_;    // engine/executor.h: runs checked transfers, counts their ends
  // Worker threads of asynchronous transfers (engine/async.h), started on first use. Declared
  // after the parts they use, so destroyed before them: its threads finish their jobs while the
  // rest of the engine still exists.
  std::unique_ptr<Async> async_;
  // Sender threads of layer-wise pushes (engine/layerwise.h). Destroyed first: it stops its pool
  // (runs what is queued, joins) before the engine's other members go, and refuses later layers.
  std::unique_ptr<LayerWise> layerwise_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_ENGINE_H_
