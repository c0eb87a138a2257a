// SPDX-License-Identifier: Apache-2.0
// The engine behind llm_datadist::LlmDataDist: options, caches, links, threads, and the checks of
// every API call in CANN's order. Concerns live in their own folders (cache/, link/, transport/,
// plan/, wire/, net/, security/); this class ties them together.
#ifndef KVBLOCKS_RUNTIME_ENGINE_ENGINE_H_
#define KVBLOCKS_RUNTIME_ENGINE_ENGINE_H_

#include <atomic>
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
#include "kvblocks/rules.h"
#include "link/registry.h"
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
struct TransferState;
class AsyncPool;
class UcxContext;
// Frees a Transfer (defined in transfer.cc) on the thread that holds its locks.
struct TransferFree {
  void operator()(Transfer *t) const;
};
using TransferPtr = std::unique_ptr<Transfer, TransferFree>;

class Impl {
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
  std::string LinkPath(uint64_t cluster_id);
  std::shared_ptr<void> PinCacheMemory(int64_t cache_id);
  int LinkChannels(uint64_t cluster_id);
  // async.cc: asynchronous blocks transfers; every request is checked (as the synchronous call)
  // before any is submitted. `failed` is the index of the request that failed.
  Status SubmitBlocks(const BlocksRequest *reqs, size_t n, TransferHandle *out, size_t *failed);

 private:
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  // lifecycle.cc
  Status StartListening(const std::string &ip, uint32_t port);
  void StopListening();
  void ListenLoop(int lfd);
  bool Spawn(std::function<void()> fn);  // false when no thread could be started
  void ReapWorkers(bool all);
  Status CheckRole(bool pull) const;
  // links.cc
  Status LinkOne(const ClusterInfo &ci, int32_t timeout_ms);
  Status OpenLink(const ClusterInfo &ci, int64_t deadline, bool *crossing);
  bool CrossingLoses(uint64_t peer) const;  // under link_state_mu_
  LocalFds OurMemfds(const std::vector<TableEntry> &caches, std::vector<std::shared_ptr<CacheEntry>> *keep);
  Status UnlinkOne(const ClusterInfo &ci, int32_t timeout_ms, bool force);
  void HandleAccepted(int fd);
  void AcceptChannel(int fd, const struct Hello &hello, int64_t deadline);
  void AcceptControl(int fd, const struct Hello &hello, const uint8_t *server_nonce, int64_t deadline);
  void CtrlLoop(std::shared_ptr<struct Link> link);
  void ServeConnection(int fd, std::shared_ptr<struct Link> link);
  void DropLink(const std::shared_ptr<struct Link> &link);
  std::shared_ptr<struct Link> NewLink(uint64_t remote_cluster_id, const struct LinkInfo &info);
  void FillLinkInfo(struct LinkInfo *info);
  int OpenChannel(const std::shared_ptr<struct Link> &link, ConnKind kind, int64_t deadline, Status *st);
  void ForgetLoose(int fd);
  // transfer.cc: the steps every transfer shares, in CANN's check order
  Status Begin(Transfer *t, bool pull);
  Status FindLocal(Transfer *t, int64_t cache_id);
  Status FindLink(Transfer *t, uint64_t cluster_id);
  Status FindRemote(Transfer *t, int64_t cache_id);
  Status Execute(Transfer *t, bool pull);
  Status PreparePullBlocks(Transfer &t, const CacheIndex &src, const Cache &dst,
                           const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                           const KvCacheExtParam &ext);
  Status PreparePushBlocks(Transfer &t, const Cache &src, const CacheIndex &dst,
                           const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                           const KvCacheExtParam &ext);
  // transfer.cc, for async.cc: a prepared transfer handed to a worker thread
  TransferPtr NewTransfer();
  Status PrepareBlocks(Transfer *t, const BlocksRequest &r);
  void Detach(Transfer *t);
  Status ExecuteDetached(Transfer *t, bool pull);
  // async.cc
  friend class AsyncPool;
  void RunDetached(TransferPtr t, bool pull, const std::shared_ptr<TransferState> &s);
  // caches.cc
  Status NotifyCacheGone(int64_t cache_id, int64_t deadline);
  // links.cc: the UCX transport (transport/ucx_path.h)
  std::shared_ptr<UcxContext> Ucx(std::string *why);  // this engine's worker, made on first need
  void AnnounceUcx(struct LinkInfo *info);
  Status AttachUcx(struct Link *link);  // after ChoosePaths

 public:
  const uint64_t cluster_id_;

 private:
  std::atomic<LlmRole> role_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> stopping_{false};
  std::shared_mutex state_mu_;  // API calls shared; Initialize/Finalize/SetRole exclusive

  // options
  int64_t wait_time_ms_ = kDefaultWaitMs;
  std::string transport_ = "auto";
  std::string auth_token_;
  bool role_check_ = true;
  bool local_comm_res_ = false;  // CANN: with llm.LocalCommRes a cluster needs no local_ip_infos

  CacheRegistry caches_;
  // Handshakes hold it shared from snapshotting our cache table until their link is registered;
  // unregister takes it once, exclusively, so every link that may have seen a cache is asked.
  std::shared_timed_mutex table_mu_;
  LinkRegistry links_;
  std::mutex linking_mu_;  // serialises handshakes that create links
  // Registration decisions (insert, adopt, crossing) of both LinkOne and the accepting side.
  std::mutex link_state_mu_;
  std::set<uint64_t> linking_;  // clusters our LinkOne is linking to right now

  // listener and worker threads
  std::mutex workers_mu_;
  std::list<Worker> workers_;
  std::set<int> loose_fds_;  // sockets still handshaking
  std::map<int, int64_t> preauth_;  // accepted, not yet authenticated: fd -> accept time (slots)
  int listen_fd_ = -1;
  std::string listen_ip_;
  uint32_t listen_port_ = 0;

  uint64_t instance_token_ = 0;
  uint64_t probe_value_ = 0;

  std::mutex ucx_mu_;
  std::shared_ptr<UcxContext> ucx_;

  // Worker threads of asynchronous transfers (async.cc), started on first use. Declared last so it
  // is destroyed first: its threads finish their jobs while the rest of the engine still exists.
  std::mutex async_mu_;
  std::shared_ptr<AsyncPool> async_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_ENGINE_H_
