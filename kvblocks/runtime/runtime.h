// SPDX-License-Identifier: Apache-2.0
// kvblocks runtime internals: caches, links, the wire protocol and the data paths.
#ifndef KVBLOCKS_RUNTIME_RUNTIME_H_
#define KVBLOCKS_RUNTIME_RUNTIME_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvblocks/ext.h"
#include "kvblocks/rules.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

using llm_datadist::Status;
using namespace llm_datadist;  // NOLINT: status constants and API types throughout the runtime

// ---------------------------------------------------------------- util.cc
int64_t NowNs();  // CLOCK_MONOTONIC
void LogWarn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void LogInfo(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool ParseUint(const std::string &s, uint64_t max, uint64_t *out);  // decimal digits only
bool ParseHostPort(const std::string &s, std::string *ip, uint32_t *port);
void RandomBytes(void *out, size_t n);

// ---------------------------------------------------------------- crypto.cc
void HmacSha256(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t msg_len, uint8_t out[32]);
bool ConstantTimeEqual(const uint8_t *a, const uint8_t *b, size_t n);

// ---------------------------------------------------------------- memory.cc
// Runtime-owned shared memory (memfd), mappable by a same-host peer through /proc/<pid>/fd/<fd>.
struct SharedRegion {
  int fd = -1;
  uint8_t *base = nullptr;
  size_t size = 0;
  uint64_t ino = 0, dev = 0;
  ~SharedRegion();
  static std::shared_ptr<SharedRegion> Create(size_t size);
  // Maps a peer's region; verifies the inode so a recycled pid or fd cannot alias another file.
  static std::shared_ptr<SharedRegion> MapPeer(int pid, int fd, uint64_t ino, uint64_t dev, size_t size);
};

struct CacheEntry {
  int64_t id = 0;
  CacheKind kind = CacheKind::kMix;
  int64_t key = -1;
  CacheDesc desc;
  uint32_t num_tensors = 0;
  uint64_t tensor_bytes = 0;
  uint64_t num_blocks = 0;  // 0 for kCache
  uint64_t batch_size = 0;
  uint64_t stride = 0;  // bytes per block / batch row
  std::vector<uint64_t> addrs;
  std::shared_ptr<SharedRegion> region;  // set for AllocateCache
  uint64_t pitch = 0;                    // distance between tensors inside region
  mutable std::shared_mutex use_mu;      // transfers hold it shared; unregister exclusive
  bool removed = false;                  // set under exclusive use_mu when unregistered
};

// Holds a cache for the duration of a transfer; `ok` is false once it has been unregistered, so a
// transfer that looked the cache up just before RemoveCache never touches freed memory.
struct CacheUse {
  std::shared_lock<std::shared_mutex> lock;
  bool ok;
  explicit CacheUse(const CacheEntry &e) : lock(e.use_mu), ok(!e.removed) {}
};

// The peer's cache as seen through a link (snapshot taken at link time).
struct RemoteCache {
  int64_t id = 0;
  CacheKind kind = CacheKind::kMix;
  int64_t key = -1;
  uint32_t num_tensors = 0;
  uint64_t tensor_bytes = 0, num_blocks = 0, batch_size = 0, stride = 0;
  std::vector<uint64_t> addrs;  // peer address space
  int32_t peer_fd = -1;
  uint64_t ino = 0, dev = 0, region_size = 0, pitch = 0;
  std::shared_ptr<SharedRegion> mapped;  // our mapping of the peer's region (same host)
  std::vector<uint8_t *> view;           // tensor bases readable/writable here, when one-sided
  bool cma = false;                      // one-sided through process_vm_readv/writev
  // Shared by copies of this entry. Transfers hold `mu` shared; the peer's CACHE_GONE takes it
  // exclusively and sets `gone` before it is acknowledged, so no one-sided copy touches memory
  // the peer frees after unregistering.
  struct Liveness {
    std::shared_mutex mu;
    bool gone = false;
  };
  std::shared_ptr<Liveness> live = std::make_shared<Liveness>();
};

struct RemoteUse {
  std::shared_lock<std::shared_mutex> lock;
  bool ok;
  explicit RemoteUse(const RemoteCache &rc) : lock(rc.live->mu), ok(!rc.live->gone) {}
};

void SerializeCacheTable(const std::vector<std::shared_ptr<CacheEntry>> &caches, std::string *out);
bool ParseCacheTable(const uint8_t *p, size_t n, std::map<int64_t, RemoteCache> *out);

// ---------------------------------------------------------------- net.cc
enum FrameType : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  kHelloAck = 4,
  kConfirm = 5,
  kConfirmAck = 6,
  kUnlink = 10,
  kUnlinkAck = 11,
  kOpenReverse = 12,
  kCacheGone = 13,     // i64 cache id: unregistered, stop using it one-sided
  kCacheGoneAck = 14,  // i64 cache id
  kReadReq = 20,
  kReadResp = 21,
  kWriteReq = 22,
  kWriteReady = 23,
  kWriteDone = 24,
  kError = 30,
};
constexpr uint32_t kMagic = 0x3142564BU;  // "KVB1" little-endian
constexpr uint32_t kProtocolVersion = 1;
constexpr uint64_t kMaxControlPayload = 64ULL << 20;
constexpr uint64_t kMaxInlineWrite = 256ULL << 10;

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint32_t status;
  uint32_t reserved;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 24, "wire header is 24 bytes");

enum class IoResult { kOk, kTimeout, kClosed, kError };

// All sockets are non-blocking; these loop with poll() until done, the deadline (NowNs() clock,
// 0 = none) passes, or the peer closes.
IoResult SendIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline);
IoResult RecvAll(int fd, void *p, size_t n, int64_t deadline);
IoResult RecvIov(int fd, struct iovec *iov, size_t iovcnt, int64_t deadline);
IoResult SendFrame(int fd, uint16_t type, uint32_t status, const void *payload, size_t n, int64_t deadline);
IoResult RecvHeader(int fd, FrameHeader *h, int64_t deadline);
int ConnectTcp(const std::string &ip, uint16_t port, int64_t deadline, Status *st);
int ListenTcp(const std::string &ip, uint32_t port, Status *st);
void TuneSocket(int fd);

// Little-endian builders for message payloads.
struct Writer {
  std::string buf;
  template <typename T>
  void Put(T v) {
    buf.append(reinterpret_cast<const char *>(&v), sizeof(T));
  }
  void PutBytes(const void *p, size_t n) { buf.append(reinterpret_cast<const char *>(p), n); }
};
struct Reader {
  const uint8_t *p;
  size_t n;
  size_t off = 0;
  bool ok = true;
  template <typename T>
  T Get() {
    T v{};
    if (off + sizeof(T) > n) {
      ok = false;
      return v;
    }
    memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  const uint8_t *Bytes(size_t k) {
    if (k > n - off || off > n) {
      ok = false;
      return nullptr;
    }
    const uint8_t *r = p + off;
    off += k;
    return r;
  }
};

// Appends [p, p+len) to an iovec list, merging it into the last entry when they touch.
inline void AppendIov(std::vector<iovec> *v, uint8_t *p, size_t len) {
  if (len == 0) return;
  if (!v->empty()) {
    iovec &last = v->back();
    if (static_cast<uint8_t *>(last.iov_base) + last.iov_len == p) {
      last.iov_len += len;
      return;
    }
  }
  v->push_back(iovec{p, len});
}

// ---------------------------------------------------------------- transfer plan
struct Segment {
  uint64_t src_off, dst_off, len;
};
struct Plan {
  std::vector<uint32_t> src_tensors, dst_tensors;  // paired tensor indices
  std::vector<Segment> segs;                       // the same byte ranges in every tensor pair
  uint64_t bytes_per_tensor = 0;
  uint64_t total_bytes() const { return bytes_per_tensor * src_tensors.size(); }
  // Pairs tensors [src_begin, src_begin + count) with [dst_begin, dst_begin + count).
  void PairTensors(uint32_t src_begin, uint32_t dst_begin, uint32_t count) {
    src_tensors.resize(count);
    dst_tensors.resize(count);
    for (uint32_t i = 0; i < count; ++i) {
      src_tensors[i] = src_begin + i;
      dst_tensors[i] = dst_begin + i;
    }
  }
};
// Merges consecutive (src, dst) block pairs into runs and appends them as byte segments.
void BuildBlockSegments(const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst, uint64_t block_bytes,
                        Plan *plan);

// ---------------------------------------------------------------- links
enum class ConnKind : uint32_t { kCtrl = 1, kDataFwd = 2, kDataRev = 3 };

struct PeerIdentity {
  uint8_t boot_id[16] = {};
  uint64_t netns = 0;
  uint32_t pid = 0;
  uint64_t instance = 0;
  uint64_t probe_addr = 0, probe_value = 0;
};

class Impl;

struct Link {
  uint64_t remote_cluster_id = 0;
  std::atomic<bool> alive{true};
  bool opener = false;
  std::string remote_ip;
  uint16_t remote_port = 0;
  uint8_t token[16] = {};
  int ctrl_fd = -1;
  int64_t clock_offset_ns = 0;  // peer clock = local clock + offset
  PeerIdentity peer;
  bool same_host = false, same_process = false, cma_ok = false;
  bool force_tcp = false;
  std::map<int64_t, RemoteCache> caches;

  std::mutex mu;  // guards the fields below
  std::condition_variable cv;
  std::vector<int> idle;  // our requester channels not in use
  std::set<int> fds;      // every socket of this link, for shutdown
  int requester_channels = 0;
  int reverse_channels = 0;  // opener: channels it serves for the acceptor
  int pending_reverse = 0;
  bool unlink_acked = false;
  std::set<int64_t> gone_acked;  // our cache ids the peer confirmed it stopped using
  std::mutex ctrl_write_mu;

  void AddFd(int fd);
  void ForgetFd(int fd);  // closes it
  void Shutdown();        // wakes every blocked I/O on the link
  // Sends a control frame unless the control connection is already closed (ctrl_fd = -1).
  bool SendCtrl(uint16_t type, int64_t deadline, const void *payload = nullptr, size_t n = 0);
  void CloseCtrl();       // closes ctrl_fd under ctrl_write_mu, so no writer can hit a reused fd
  ~Link();
};

struct Worker {
  std::thread thread;
  std::atomic<bool> done{false};
};

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

  // used by the connection threads
  void ServeConnection(int fd, std::shared_ptr<struct Link> link);
  void HandleAccepted(int fd);

 private:
  friend struct ::kvblocks::ImplAccess;
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  Status StartListening(const std::string &ip, uint32_t port);
  void StopListening();
  void ListenLoop(int lfd);
  bool Spawn(std::function<void()> fn);  // false when no thread could be started
  void ReapWorkers(bool all);
  void CtrlLoop(std::shared_ptr<struct Link> link);
  Status LinkOne(const ClusterInfo &ci, int32_t timeout_ms);
  Status UnlinkOne(const ClusterInfo &ci, int32_t timeout_ms, bool force);
  void DropLink(const std::shared_ptr<struct Link> &link, bool erase);
  std::shared_ptr<struct Link> FindLink(uint64_t cluster_id);
  std::shared_ptr<CacheEntry> FindCache(int64_t id);
  void SnapshotCaches(std::string *out);
  void FillIdentity(PeerIdentity *id);
  void ResolvePaths(struct Link *link);
  int OpenChannel(const std::shared_ptr<struct Link> &link, ConnKind kind, int64_t deadline, Status *st);
  int AcquireChannel(const std::shared_ptr<struct Link> &link, int64_t deadline, Status *st);
  void ReleaseChannel(const std::shared_ptr<struct Link> &link, int fd, bool reusable);
  Status Handshake(int fd, ConnKind kind, const uint8_t *link_token, const std::string &extra, int64_t deadline,
                   std::string *reply_payload);
  Status ExecuteRemote(const std::shared_ptr<struct Link> &link, const RemoteCache &rc, const CacheEntry &lc,
                       const Plan &plan, bool pull, int64_t deadline);
  Status ExecuteTcp(const std::shared_ptr<struct Link> &link, const RemoteCache &rc, const CacheEntry &lc,
                    const Plan &plan, bool pull, int64_t deadline);
  Status CheckRole(bool pull) const;
  void FailLink(const std::shared_ptr<struct Link> &link);
  void NotifyCacheGone(int64_t cache_id);

 public:
  const uint64_t cluster_id_;

 private:
  std::atomic<LlmRole> role_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> stopping_{false};
  std::shared_mutex state_mu_;  // API calls shared; Initialize/Finalize/SetRole exclusive

  // options
  int64_t wait_time_ms_ = 1000;
  std::string transport_ = "auto";
  std::string auth_token_;
  bool role_check_ = true;
  bool local_comm_res_ = false;  // CANN: with llm.LocalCommRes a cluster needs no local_ip_infos

  // caches
  std::shared_mutex caches_mu_;
  std::map<int64_t, std::shared_ptr<CacheEntry>> caches_;
  int64_t next_cache_id_ = 1;

  // links
  std::mutex links_mu_;
  std::map<uint64_t, std::shared_ptr<struct Link>> links_;
  std::mutex linking_mu_;  // serialises handshakes that create links

  // listener and worker threads
  std::mutex workers_mu_;
  std::list<Worker> workers_;
  std::set<int> loose_fds_;  // sockets still handshaking
  int listen_fd_ = -1;
  std::string listen_ip_;
  uint32_t listen_port_ = 0;

 public:
  uint64_t instance_token_ = 0;
  uint64_t probe_value_ = 0;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_RUNTIME_H_
