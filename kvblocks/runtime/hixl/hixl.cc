// SPDX-License-Identifier: Apache-2.0
// hixl::Hixl: CANN's hixl engine on the kvblocks runtime (see hixl_impl.h). Failures are status
// codes, never exceptions; the reason of a runtime failure is the thread's last error.
#include <cstdlib>
#include <exception>

#include "common/error.h"
#include "common/util.h"
#include "hixl/hixl_impl.h"

namespace hixl {

namespace {

using kvblocks::AddrRange;
namespace llm = llm_datadist;

static_assert(sizeof(TransferOpDesc) == sizeof(AddrRange) && offsetof(TransferOpDesc, remote_addr) == 8 &&
                  offsetof(TransferOpDesc, len) == 16,
              "a TransferOpDesc list is handed to the runtime as AddrRanges");

constexpr int32_t kAutoConnectAsyncMs = 3000;  // hixl: transfer_async's implicit connect

// A server engine's cluster id comes from its name, so a client derives it from the name it
// connects to; a client-only engine (nobody connects to it) gets a random one.
uint64_t NameId(const std::string &name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  h &= 0x7FFFFFFFFFFFFFFFULL;
  return h == 0 ? 1 : h;
}

uint64_t RandomId() {
  uint64_t v;
  kvblocks::RandomBytes(&v, sizeof(v));
  return v | (1ULL << 63);
}

// A runtime status as hixl reports it.
Status FromLlm(llm::Status st) {
  switch (st) {
    case llm::LLM_SUCCESS: return SUCCESS;
    case llm::LLM_PARAM_INVALID:
    case llm::LLM_KV_CACHE_NOT_EXIST: return PARAM_INVALID;
    case llm::LLM_TIMEOUT: return TIMEOUT;
    case llm::LLM_LINK_BUSY: return RESOURCE_EXHAUSTED;
    default: return FAILED;
  }
}

std::string Str(const AscendString &s) { return std::string(s.GetString(), s.GetLength()); }

bool ZeroAddress(const std::vector<TransferOpDesc> &descs) {
  for (const TransferOpDesc &d : descs)
    if (d.local_addr == 0 || d.remote_addr == 0) return true;
  return false;
}

template <typename F>
Status Guard(F &&f) noexcept {
  kvblocks::ClearLastError();
  try {
    return f();
  } catch (...) {
    return FAILED;
  }
}

}  // namespace

// ---------------------------------------------------------------- lifecycle
Status HixlImpl::Initialize(const std::string &local_engine, const std::map<AscendString, AscendString> &options) {
  std::unique_lock<std::shared_mutex> lk(api_mu_);
  if (live()) return SUCCESS;
  std::string ip;
  uint16_t port;
  if (!kvblocks::hixlrt::ParseEngineName(local_engine, &ip, &port))
    return kvblocks::Fail(PARAM_INVALID, "\"%s\" is not ip, ip:port, [ip6] or [ip6]:port", local_engine.c_str());
  kvblocks::hixlrt::HixlOptions opts;
  if (ParseOptions(options, &opts) != SUCCESS) return PARAM_INVALID;
  std::map<AscendString, AscendString> o{{llm::OPTION_DEVICE_ID, "0"}, {llm::OPTION_LOCAL_COMM_RES, ""}};
  if (port != 0) {
    const std::string listen = (ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":" + std::to_string(port);
    o[llm::OPTION_LISTEN_IP_INFO] = AscendString(listen.c_str());
  }
  // hixl's option table is closed: kvblocks' data-path choice comes from the environment.
  if (const char *t = getenv("KVBLOCKS_TRANSPORT")) o[kvblocks::OPTION_TRANSPORT] = AscendString(t);
  std::unique_ptr<kvblocks::Impl> engine(new kvblocks::Impl(port != 0 ? NameId(local_engine) : RandomId(), llm::LlmRole::kMix));
  const llm::Status st = engine->Initialize(o);
  if (st != llm::LLM_SUCCESS) return st == llm::LLM_PARAM_INVALID ? PARAM_INVALID : FAILED;
  engine_ = std::move(engine);
  name_ = local_engine;
  opts_ = opts;
  std::lock_guard<std::mutex> g(pool_mu_);
  pool_stop_ = false;
  return SUCCESS;
}

void HixlImpl::Finalize() {
  StopConnectPool();  // its workers call Connect: joined before the exclusive lock
  std::unique_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return;
  engine_->Finalize();  // closes links, forgets transfers and registrations, stops listening
  engine_.reset();
  std::lock_guard<std::mutex> g(mu_);
  connected_.clear();
  regions_.clear();
  requests_.clear();
}

// ---------------------------------------------------------------- memory
Status HixlImpl::RegisterMem(const MemDesc &mem, MemType type, uint64_t *handle) {
  *handle = 0;
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  uint64_t end;
  if (mem.addr == 0 || mem.len == 0 || __builtin_add_overflow(mem.addr, mem.len, &end) ||
      (type != MEM_DEVICE && type != MEM_HOST))
    return kvblocks::Fail(PARAM_INVALID, "MemDesc(addr=0x%llx, len=%llu) type %d: needs addr != 0, len > 0, no "
                          "overflow and MEM_DEVICE or MEM_HOST", (unsigned long long)mem.addr,
                          (unsigned long long)mem.len, static_cast<int>(type));
  std::lock_guard<std::mutex> g(mu_);
  for (const auto &kv : regions_) {
    const Region &r = kv.second;
    if (r.type != type) continue;  // the two memory types may overlap
    if (r.addr == mem.addr && r.len == mem.len) {
      *handle = kv.first;
      return SUCCESS;
    }
    if (mem.addr < r.addr + r.len && r.addr < end)
      return kvblocks::Fail(PARAM_INVALID, "[0x%llx, +%llu) overlaps a registration", (unsigned long long)mem.addr,
                            (unsigned long long)mem.len);
  }
  llm::CacheDesc desc;
  desc.placement = type == MEM_DEVICE ? llm::CachePlacement::kDevice : llm::CachePlacement::kHost;
  desc.num_tensors = 1;
  desc.data_type = ge::DT_UINT8;
  desc.shape = {1, static_cast<int64_t>(mem.len)};
  llm::Cache cache;
  const llm::Status st =
      engine_->AddCache(desc, {static_cast<uint64_t>(mem.addr)}, kvblocks::CacheKind::kBlocks, -1, &cache, false);
  if (st != llm::LLM_SUCCESS) return FromLlm(st);
  *handle = ++next_handle_;
  regions_[*handle] = Region{mem.addr, mem.len, type, cache.cache_id};
  return SUCCESS;
}

Status HixlImpl::DeregisterMem(uint64_t handle) {
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (handle == 0) return kvblocks::Fail(PARAM_INVALID, "mem_handle is 0");
  std::lock_guard<std::mutex> g(mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) return SUCCESS;
  if (!connected_.empty()) return kvblocks::Fail(FAILED, "disconnect every remote engine before deregistering");
  // Waits until no transfer and no peer uses the memory; a frozen peer keeps it registered.
  const llm::Status st = engine_->RemoveCache(it->second.cache_id);
  if (st != llm::LLM_SUCCESS) return FAILED;
  regions_.erase(it);
  return SUCCESS;
}

// ---------------------------------------------------------------- links
Status HixlImpl::Connect(const std::string &remote, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  return ConnectLocked(remote, timeout_ms);
}

Status HixlImpl::ConnectLocked(const std::string &remote, int32_t timeout_ms) {
  if (!live()) return FAILED;
  if (timeout_ms <= 0) return kvblocks::Fail(PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  std::string ip;
  uint16_t port;
  if (!kvblocks::hixlrt::ParseEngineName(remote, &ip, &port))
    return kvblocks::Fail(PARAM_INVALID, "\"%s\" is not an engine name", remote.c_str());
  if (remote == name_) return kvblocks::Fail(PARAM_INVALID, "an engine cannot connect to itself");
  {
    std::lock_guard<std::mutex> g(mu_);
    if (connected_.count(remote)) return ALREADY_CONNECTED;
  }
  if (port == 0) return kvblocks::Fail(FAILED, "\"%s\" is a client-only engine: nobody listens", remote.c_str());
  const uint64_t id = NameId(remote);
  const llm::Status st = engine_->LinkAddress(id, ip, port, timeout_ms);
  if (st == llm::LLM_ALREADY_LINK) return ALREADY_CONNECTED;
  if (st != llm::LLM_SUCCESS) return st == llm::LLM_TIMEOUT ? TIMEOUT : FAILED;
  std::lock_guard<std::mutex> g(mu_);
  connected_[remote] = id;
  return SUCCESS;
}

Status HixlImpl::Disconnect(const std::string &remote, int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (timeout_ms <= 0) return kvblocks::Fail(PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  uint64_t id;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = connected_.find(remote);
    if (it == connected_.end()) return NOT_CONNECTED;
    id = it->second;
    connected_.erase(it);
  }
  ForgetRequests(remote);
  engine_->UnlinkCluster(id, timeout_ms);  // the link is gone here whatever the peer answers
  return SUCCESS;
}

void HixlImpl::ForgetRequests(const std::string &remote) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (it->second.remote == remote) it = requests_.erase(it);
    else ++it;
  }
}

Status HixlImpl::Route(const std::string &remote, int32_t timeout_ms, uint64_t *cluster_id) {
  for (int attempt = 0;; ++attempt) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = connected_.find(remote);
      if (it != connected_.end()) {
        *cluster_id = it->second;
        return SUCCESS;
      }
    }
    if (!opts_.auto_connect || attempt > 0) return kvblocks::Fail(NOT_CONNECTED, "not connected to \"%s\"", remote.c_str());
    const Status st = ConnectLocked(remote, timeout_ms);
    if (st != SUCCESS && st != ALREADY_CONNECTED) return st;
  }
}

// Auto-connect mode: a failed transfer tears the link down, so the next one reconnects.
void HixlImpl::DropAuto(const std::string &remote) {
  if (!opts_.auto_connect) return;
  uint64_t id;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = connected_.find(remote);
    if (it == connected_.end()) return;
    id = it->second;
    connected_.erase(it);
  }
  ForgetRequests(remote);
  engine_->UnlinkCluster(id, 1000);
}

// ---------------------------------------------------------------- transfers
Status HixlImpl::TransferSync(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                              int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (timeout_ms <= 0) return kvblocks::Fail(PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  if (ZeroAddress(descs)) return kvblocks::Fail(PARAM_INVALID, "a descriptor has address 0");
  uint64_t id;
  Status st = Route(remote, timeout_ms, &id);
  if (st != SUCCESS) return st;
  if (descs.empty()) return kvblocks::Fail(PARAM_INVALID, "op_descs is empty");
  if (op != READ && op != WRITE) return kvblocks::Fail(PARAM_INVALID, "operation %d is not READ or WRITE", op);
  const auto *ranges = reinterpret_cast<const AddrRange *>(descs.data());
  st = FromLlm(engine_->TransferRanges(id, op == READ, ranges, descs.size(), timeout_ms));
  if (st != SUCCESS) DropAuto(remote);
  return st;
}

Status HixlImpl::TransferAsync(const std::string &remote, TransferOp op, const std::vector<TransferOpDesc> &descs,
                               const void *user_data, uint64_t *req) {
  *req = 0;
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (ZeroAddress(descs)) return kvblocks::Fail(PARAM_INVALID, "a descriptor has address 0");
  uint64_t id;
  Status st = Route(remote, kAutoConnectAsyncMs, &id);
  if (st != SUCCESS) return st;
  if (descs.empty()) return kvblocks::Fail(PARAM_INVALID, "op_descs is empty");
  if (op != READ && op != WRITE) return kvblocks::Fail(PARAM_INVALID, "operation %d is not READ or WRITE", op);
  kvblocks::TransferHandle h;
  const auto *ranges = reinterpret_cast<const AddrRange *>(descs.data());
  st = FromLlm(engine_->SubmitRanges(id, op == READ, ranges, descs.size(), -1, &h));
  if (st != SUCCESS) {
    DropAuto(remote);
    return st;
  }
  std::lock_guard<std::mutex> g(mu_);
  *req = ++next_req_;
  requests_.emplace(*req, Request{std::move(h), user_data, remote});
  return SUCCESS;
}

Status HixlImpl::GetTransferStatus(uint64_t req, TransferStatus *status) {
  *status = TransferStatus::FAILED;
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live() || req == 0) return FAILED;
  std::string failed_remote;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = requests_.find(req);
    if (it == requests_.end()) return kvblocks::Fail(PARAM_INVALID, "unknown or already retired request");
    if (!it->second.handle.Done()) {
      *status = TransferStatus::WAITING;
      return SUCCESS;
    }
    *status = it->second.handle.Status() == llm::LLM_SUCCESS ? TransferStatus::COMPLETED : TransferStatus::FAILED;
    if (*status == TransferStatus::FAILED) failed_remote = it->second.remote;
    requests_.erase(it);
  }
  if (!failed_remote.empty()) DropAuto(failed_remote);
  return SUCCESS;
}

Status HixlImpl::GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> *results) {
  results->clear();
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (args.max_query_count == 0) return SUCCESS;
  std::vector<std::string> failed;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = requests_.begin(); it != requests_.end() && results->size() < args.max_query_count;) {
      TransferResult r;
      r.req = reinterpret_cast<TransferReq>(static_cast<uintptr_t>(it->first));
      r.user_data = it->second.user_data;
      if (!it->second.handle.Done()) {
        ++it;
        if (args.skip_waiting) continue;
        results->push_back(r);
        continue;
      }
      r.status = it->second.handle.Status() == llm::LLM_SUCCESS ? TransferStatus::COMPLETED : TransferStatus::FAILED;
      if (r.status == TransferStatus::FAILED) failed.push_back(it->second.remote);
      results->push_back(r);
      it = requests_.erase(it);
    }
  }
  for (const std::string &remote : failed) DropAuto(remote);
  return SUCCESS;
}

// ---------------------------------------------------------------- notify
Status HixlImpl::SendNotify(const std::string &remote, const std::string &name, const std::string &msg,
                            int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (name.size() > kvblocks::kMaxNotifyName) return kvblocks::Fail(PARAM_INVALID, "name is longer than 1024 bytes");
  if (timeout_ms <= 0) return kvblocks::Fail(PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  if (msg.size() > kvblocks::kMaxNotifyMessage) return kvblocks::Fail(PARAM_INVALID, "notify_msg is longer than 1024 bytes");
  const int64_t deadline = kvblocks::NowNs() + static_cast<int64_t>(timeout_ms) * kvblocks::kMsNs;
  uint64_t id;
  std::vector<kvblocks::TransferHandle> earlier;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = connected_.find(remote);
    if (it == connected_.end()) return kvblocks::Fail(NOT_CONNECTED, "not connected to \"%s\"", remote.c_str());
    id = it->second;
    for (const auto &kv : requests_)
      if (kv.second.remote == remote && !kv.second.handle.Done()) earlier.push_back(kv.second.handle);
  }
  // "Your blocks are there": the async transfers submitted before this notify land first.
  for (const kvblocks::TransferHandle &h : earlier) {
    const int64_t left_ms = (deadline - kvblocks::NowNs()) / kvblocks::kMsNs;
    if (left_ms <= 0 || h.Wait(left_ms) == llm::LLM_WAIT_PROC_TIMEOUT)
      return kvblocks::Fail(TIMEOUT, "earlier transfers to \"%s\" did not finish within %d ms", remote.c_str(), timeout_ms);
  }
  const int64_t left_ms = (deadline - kvblocks::NowNs()) / kvblocks::kMsNs;
  if (left_ms <= 0) return TIMEOUT;
  return FromLlm(engine_->SendNotify(id, name, msg, static_cast<int32_t>(left_ms)));
}

Status HixlImpl::GetNotifies(std::vector<NotifyDesc> *out) {
  out->clear();
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  std::vector<kvblocks::NotifyMessage> got;
  const llm::Status st = engine_->GetNotifies(&got);
  if (st != llm::LLM_SUCCESS) return FromLlm(st);
  out->reserve(got.size());
  for (const auto &n : got)
    out->push_back(NotifyDesc{AscendString(n.name.data(), n.name.size()), AscendString(n.message.data(), n.message.size())});
  return SUCCESS;
}

// ---------------------------------------------------------------- connect_async / disconnect_async
Status HixlImpl::ConnectAsync(const std::string &remote, int32_t timeout_ms, bool connect) {
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  if (timeout_ms <= 0) return kvblocks::Fail(PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  std::lock_guard<std::mutex> g(pool_mu_);
  if (pool_stop_) return FAILED;
  if (tasks_.size() >= opts_.connect_queue_capacity)
    return kvblocks::Fail(RESOURCE_EXHAUSTED, "%zu connect tasks are queued", tasks_.size());
  const uint64_t seq = ++next_task_;
  tasks_.push_back(Task{remote, connect, timeout_ms, seq});
  RemoteState &rs = remote_states_[remote];
  rs.latest = seq;
  rs.state = connect ? AsyncConnectStatus::CONNECT_PENDING : AsyncConnectStatus::DISCONNECT_PENDING;
  if (workers_.size() < opts_.connect_threads) workers_.emplace_back([this] { ConnectWorker(); });
  pool_cv_.notify_all();
  return SUCCESS;
}

// Tasks of one remote run one at a time, in order; different remotes in parallel. The state shown
// is always that of the latest submitted task.
void HixlImpl::ConnectWorker() {
  std::unique_lock<std::mutex> lk(pool_mu_);
  for (;;) {
    auto next = tasks_.end();
    pool_cv_.wait(lk, [&] {
      if (pool_stop_) return true;
      for (next = tasks_.begin(); next != tasks_.end(); ++next)
        if (!remote_states_[next->remote].running) return true;
      return false;
    });
    if (pool_stop_) return;
    const Task task = *next;
    tasks_.erase(next);
    RemoteState *rs = &remote_states_[task.remote];
    rs->running = true;
    if (rs->latest == task.seq)
      rs->state = task.connect ? AsyncConnectStatus::CONNECTING : AsyncConnectStatus::DISCONNECTING;
    lk.unlock();
    const Status st = task.connect ? Connect(task.remote, task.timeout_ms) : Disconnect(task.remote, task.timeout_ms);
    lk.lock();
    if (pool_stop_) return;
    rs = &remote_states_[task.remote];
    rs->running = false;
    if (rs->latest == task.seq) {
      if (!task.connect) remote_states_.erase(task.remote);
      else rs->state = st == SUCCESS || st == ALREADY_CONNECTED ? AsyncConnectStatus::CONNECTED : AsyncConnectStatus::CONNECT_FAILED;
    }
    pool_cv_.notify_all();
  }
}

void HixlImpl::StopConnectPool() {
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> g(pool_mu_);
    pool_stop_ = true;
    tasks_.clear();
    remote_states_.clear();
    workers.swap(workers_);
  }
  pool_cv_.notify_all();
  for (auto &t : workers) t.join();
}

Status HixlImpl::GetAsyncConnectStatus(const std::string &remote, AsyncConnectStatus *status) {
  *status = AsyncConnectStatus::NOT_CONNECT;
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  std::lock_guard<std::mutex> g(pool_mu_);
  auto it = remote_states_.find(remote);
  if (it != remote_states_.end()) *status = it->second.state;
  return SUCCESS;
}

Status HixlImpl::GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> *statuses) {
  statuses->clear();
  std::shared_lock<std::shared_mutex> lk(api_mu_);
  if (!live()) return FAILED;
  std::lock_guard<std::mutex> g(pool_mu_);
  for (const auto &kv : remote_states_)
    if (kv.second.state != AsyncConnectStatus::NOT_CONNECT) (*statuses)[AscendString(kv.first.c_str())] = kv.second.state;
  return SUCCESS;
}

// ---------------------------------------------------------------- the public class
Hixl::Hixl() : impl_(new HixlImpl) {}
Hixl::~Hixl() { Finalize(); }

Status Hixl::Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options) {
  return Guard([&] { return impl_->Initialize(Str(local_engine), options); });
}
void Hixl::Finalize() {
  Guard([&] {
    impl_->Finalize();
    return SUCCESS;
  });
}
Status Hixl::RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
  uint64_t h = 0;
  const Status st = Guard([&] { return impl_->RegisterMem(mem, type, &h); });
  mem_handle = reinterpret_cast<MemHandle>(static_cast<uintptr_t>(st == SUCCESS ? h : 0));
  return st;
}
Status Hixl::DeregisterMem(MemHandle mem_handle) {
  return Guard([&] { return impl_->DeregisterMem(reinterpret_cast<uintptr_t>(mem_handle)); });
}
Status Hixl::Connect(const AscendString &remote_engine, int32_t timeout_in_millis) {
  return Guard([&] { return impl_->Connect(Str(remote_engine), timeout_in_millis); });
}
Status Hixl::Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis) {
  return Guard([&] { return impl_->Disconnect(Str(remote_engine), timeout_in_millis); });
}
Status Hixl::ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis) {
  return Guard([&] { return impl_->ConnectAsync(Str(remote_engine), timeout_in_millis, true); });
}
Status Hixl::DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis) {
  return Guard([&] { return impl_->ConnectAsync(Str(remote_engine), timeout_in_millis, false); });
}
Status Hixl::GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status) {
  return Guard([&] { return impl_->GetAsyncConnectStatus(Str(remote_engine), &status); });
}
Status Hixl::GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses) {
  return Guard([&] { return impl_->GetAsyncConnectStatus(&statuses); });
}
Status Hixl::TransferSync(const AscendString &remote_engine, TransferOp operation,
                          const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis) {
  return Guard([&] { return impl_->TransferSync(Str(remote_engine), operation, op_descs, timeout_in_millis); });
}
Status Hixl::TransferAsync(const AscendString &remote_engine, TransferOp operation,
                           const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                           TransferReq &req) {
  uint64_t r = 0;
  const Status st =
      Guard([&] { return impl_->TransferAsync(Str(remote_engine), operation, op_descs, optional_args.user_data, &r); });
  req = reinterpret_cast<TransferReq>(static_cast<uintptr_t>(st == SUCCESS ? r : 0));
  return st;
}
Status Hixl::GetTransferStatus(const TransferReq &req, TransferStatus &status) {
  status = TransferStatus::FAILED;
  return Guard([&] { return impl_->GetTransferStatus(reinterpret_cast<uintptr_t>(req), &status); });
}
Status Hixl::GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results) {
  return Guard([&] { return impl_->GetTransferStatus(args, &results); });
}
Status Hixl::SendNotify(const AscendString &remote_engine, const NotifyDesc &notify, int32_t timeout_in_millis) {
  return Guard([&] {
    return impl_->SendNotify(Str(remote_engine), Str(notify.name), Str(notify.notify_msg), timeout_in_millis);
  });
}
Status Hixl::GetNotifies(std::vector<NotifyDesc> &notifies) {
  return Guard([&] { return impl_->GetNotifies(&notifies); });
}
Status Hixl::GetCapability(FeatureType feature_type, int32_t &value) {
  const int32_t f = static_cast<int32_t>(feature_type);
  value = FEATURE_NOT_SUPPORTED;
  if (f < 0) return PARAM_INVALID;
  if (f == AUTO_CONNECT || f == CLIENT_SERVER_COMM) value = FEATURE_SUPPORTED;
  return SUCCESS;
}

}  // namespace hixl
