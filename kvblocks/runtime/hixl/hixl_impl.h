// SPDX-License-Identifier: Apache-2.0
// The hixl engine on the kvblocks runtime. One kvblocks::Impl per initialized Hixl: a registered
// memory region is a one-tensor cache, a connection is a link (keyed by the remote engine name,
// whose cluster id is derived from it), transfers are address ranges (engine/ranges.cc) and
// notifications go on the link's control connection (engine/notify.cc).
#ifndef KVBLOCKS_RUNTIME_HIXL_HIXL_IMPL_H_
#define KVBLOCKS_RUNTIME_HIXL_HIXL_IMPL_H_

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "hixl/hixl.h"
#include "hixl/options.h"

namespace hixl {

class HixlImpl {
 public:
  HixlImpl() = default;
  ~HixlImpl() { Finalize(); }

  Status Initialize(const std::string &local_engine, const std::map<AscendString, AscendString> &options);
  void Finalize();
  Status RegisterMem(const MemDesc &mem, MemType type, uint64_t *handle);
  Status DeregisterMem(uint64_t handle);
  Status Connect(const std::string &remote, int32_t timeout_ms);
  Status Disconnect(const std::string &remote, int32_t timeout_ms);
  Status ConnectAsync(const std::string &remote, int32_t timeout_ms, bool connect);
  Status GetAsyncConnectStatus(const std::string &remote, AsyncConnectStatus *status);
  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> *statuses);
  Status TransferSync(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                      int32_t timeout_ms);
  Status TransferAsync(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                       const void *user_data, uint64_t *req);
  Status GetTransferStatus(uint64_t req, TransferStatus *status);
  Status GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> *results);
  Status SendNotify(const std::string &remote, const std::string &name, const std::string &msg, int32_t timeout_ms);
  Status GetNotifies(std::vector<NotifyDesc> *out);

 private:
  struct Region {
    uint64_t addr, len;
    MemType type;
    int64_t cache_id;
  };
  struct Request {
    kvblocks::TransferHandle handle;
    const void *user_data;
    std::string remote;
  };
  struct Task {
    std::string remote;
    bool connect;
    int32_t timeout_ms;
    uint64_t seq;
  };
  struct RemoteState {
    AsyncConnectStatus state = AsyncConnectStatus::NOT_CONNECT;
    uint64_t latest = 0;  // seq of the latest submitted task: only its result is shown
    bool running = false;
  };

  bool live() const { return engine_ != nullptr; }
  Status ConnectLocked(const std::string &remote, int32_t timeout_ms);  // api_mu_ held shared
  // The connected remote's cluster id, auto-connecting when enabled; NOT_CONNECTED otherwise.
  Status Route(const std::string &remote, int32_t timeout_ms, uint64_t *cluster_id);
  void DropAuto(const std::string &remote);
  Status Finish(uint64_t req, const Request &r, TransferStatus *status);  // retires a done request
  void ConnectWorker();
  void StopConnectPool();
  void ForgetRequests(const std::string &remote);

  std::shared_mutex api_mu_;  // calls shared; Initialize/Finalize exclusive
  std::unique_ptr<kvblocks::Impl> engine_;
  std::string name_;
  kvblocks::hixlrt::HixlOptions opts_;

  std::mutex mu_;  // guards the maps below
  std::map<std::string, uint64_t> connected_;  // remote name -> its cluster id
  std::map<uint64_t, Region> regions_;         // handle -> region
  uint64_t next_handle_ = 0;
  std::map<uint64_t, Request> requests_;       // req -> request, in submission order
  uint64_t next_req_ = 0;

  // connect_async / disconnect_async
  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::deque<Task> tasks_;
  std::map<std::string, RemoteState> remote_states_;
  std::vector<std::thread> workers_;
  uint64_t next_task_ = 0;
  bool pool_stop_ = false;
};

}  // namespace hixl

#endif  // KVBLOCKS_RUNTIME_HIXL_HIXL_IMPL_H_
