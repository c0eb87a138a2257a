// SPDX-License-Identifier: Apache-2.0
// libkvblocks_ucx.so: the UCP side of kvblocks' UCX transport (see transport/backend_abi.h). One UCP
// context and worker per engine, in multi-thread mode: a progress thread serves the peer's
// emulated operations and wire-up, and callers progress the worker themselves while they wait.
// Those emulated operations read and write any address a peer names (UCX checks none against a
// registration): the runtime makes a context only on a network the user declared trusted.
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "backend_abi.h"

struct kvb_ctx {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_address_t *address = nullptr;
  size_t address_len = 0;
  int efd = -1;
  std::atomic<bool> stop{false};
  std::thread progress;
  // Callers waiting for their operations progress the worker themselves; the progress thread stands
  // down meanwhile, so that it does not take the events (and the CPU) they wait for.
  std::atomic<int> waiters{0};
  std::atomic<int> sleepers{0};  // callers asleep on efd: a completion must signal the worker
  std::mutex mu;
  std::condition_variable cv;
  // Endpoints closed while a flush of theirs was still in flight: the progress thread closes each
  // UCP endpoint once its flushes finished (Close(), Reap()).
  std::mutex graves_mu;
  std::vector<kvb_ep *> graves;
  std::atomic<int> ngraves{0};
};

// A flush request and what its callback sets: on the heap, as it may outlive the call that posted it.
struct Flushed {
  kvb_ctx *ctx;
  void *req = nullptr;
  std::atomic<bool> done{false};  // the callback returned
};

struct kvb_mem {
  kvb_ctx *ctx;
  ucp_mem_h memh;
  void *rkey = nullptr;
  size_t rkey_len = 0;
};

// The phases of a call on an endpoint (see the gate in kvb_ep).
enum Phase { kOps = 0, kFlush = 1 };

struct kvb_ep {
  kvb_ctx *ctx;
  ucp_ep_h ep = nullptr;
  std::shared_mutex mu;  // posting holds it shared; the force-close exclusive
  bool closed = false;   // the UCP endpoint is closed (under mu)
  std::atomic<bool> failed{false};  // the error handler ran (peer failure)
  // The gate, under gate_mu. A call posts its operations and waits for them in the ops phase, then
  // (puts) flushes in the flush phase; the two phases never overlap on one endpoint, so a call that
  // must force-close (to cancel its operations) never does so under a flush in flight. UCX 1.22 can
  // leave a flush it parked on the worker's progress queue pointing at the freed endpoint (the
  // resume callback then crashes the next ucp_worker_progress), so a flush in flight is never closed
  // under: its endpoint is retired and closed once it finished (Retire, Close, Reap).
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  int active[2] = {0, 0};   // calls in each phase
  int waiting[2] = {0, 0};  // calls waiting to enter it (a waiting flush goes before new operations)
  bool retired = false;     // a call failed or timed out: no new one starts
  std::vector<Flushed *> lingering;  // flushes still in flight whose call returned before them
};

struct kvb_rkey {
  ucp_rkey_h rkey;
};

namespace {

int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void Say(char *err, size_t errlen, const char *what, ucs_status_t st) {
  if (err != nullptr && errlen != 0) snprintf(err, errlen, "%s: %s", what, ucs_status_string(st));
}

// Progresses, or sleeps on the worker's event fd until something happens (at most 1 ms).
void ProgressOrWait(ucp_worker_h w, int efd) {
  if (ucp_worker_progress(w) != 0) return;
  if (ucp_worker_arm(w) != UCS_OK) return;  // busy: events are pending
  pollfd p{efd, POLLIN, 0};
  poll(&p, 1, 1);
}

// How long the progress thread keeps polling after its last event before it sleeps: the peer's next
// request of a burst is usually microseconds away, and waking a sleeping thread costs tens of them on
// virtual machines. KVBLOCKS_SPIN_US, as kvblocks' own sockets (default 50; 0: sleep at once).
int64_t SpinNs() {
  const char *v = getenv("KVBLOCKS_SPIN_US");
  return (v != nullptr ? atoll(v) : 50) * 1000;
}

// While callers wait they progress the worker themselves (serving the peer's requests too); the
// progress thread parks, checking every kParkMs whether they are gone.
constexpr int kParkMs = 1;

void Reap(kvb_ctx *c);

void ProgressLoop(kvb_ctx *c) {
  const int64_t spin = SpinNs();
  int64_t last = 0, next_reap = 0;
  while (!c->stop.load(std::memory_order_relaxed)) {
    if (c->ngraves.load(std::memory_order_relaxed) > 0 && Now() >= next_reap) {
      Reap(c);
      next_reap = Now() + 1000000;
    }
    if (c->waiters.load() > 0) {
      std::unique_lock<std::mutex> g(c->mu);
      c->cv.wait_for(g, std::chrono::milliseconds(kParkMs), [c] { return c->stop.load(); });
      last = 0;  // the caller just drained the worker: sleep unless something new comes
      continue;
    }
    if (ucp_worker_progress(c->worker) != 0) {
      last = Now();
      continue;
    }
    if (Now() - last < spin) {
      sched_yield();  // a woken peer thread on this core runs first (two cores, loopback)
      continue;
    }
    if (ucp_worker_arm(c->worker) != UCS_OK) continue;
    pollfd p{c->efd, POLLIN, 0};
    poll(&p, 1, 100);
  }
}

// Waits for a request (or an immediate result) to finish; false when `deadline` passed first.
bool Wait(kvb_ctx *c, void *req, int64_t deadline, ucs_status_t *st) {
  if (req == nullptr) {
    *st = UCS_OK;
    return true;
  }
  if (UCS_PTR_IS_ERR(req)) {
    *st = UCS_PTR_STATUS(req);
    return true;
  }
  while ((*st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    if (Now() >= deadline) return false;
    ProgressOrWait(c->worker, c->efd);
  }
  return true;
}

// A caller waiting: polls the worker, yielding the core between polls, while it makes progress or
// has been idle for a short while; then sleeps on the worker's event fd (at most 1 ms at a time).
// Spinning costs nothing a transfer does not use: over tcp, progress is what feeds the socket. The
// yield matters on loopback: the kernel wakes the peer's thread on the core we spin on.
class Waiter {
 public:
  explicit Waiter(kvb_ctx *c) : c_(c) { c_->waiters.fetch_add(1); }
  // No wake-up for the progress thread: it resumes within kParkMs by itself. Waking it after every
  // call puts a third spinning thread on two cores and doubles small-call latency (60 -> 130 us).
  ~Waiter() { c_->waiters.fetch_sub(1); }
  // `done`: set by the completion callback; checked after announcing the sleep (no lost wake-up).
  void Step(int64_t now, const std::atomic<bool> &done) {
    if (ucp_worker_progress(c_->worker) != 0) {
      idle_since_ = 0;
      return;
    }
    if (idle_since_ == 0) idle_since_ = now;
    if (now - idle_since_ < kSpinNs) {
      sched_yield();
      return;
    }
    c_->sleepers.fetch_add(1);
    if (!done.load() && ucp_worker_arm(c_->worker) == UCS_OK) {
      pollfd p{c_->efd, POLLIN, 0};
      poll(&p, 1, 1);
    }
    c_->sleepers.fetch_sub(1);
  }

 private:
  static constexpr int64_t kSpinNs = 5000000;
  kvb_ctx *c_;
  int64_t idle_since_ = 0;
};

void OnError(void *arg, ucp_ep_h, ucs_status_t) { static_cast<kvb_ep *>(arg)->failed.store(true); }

// Force-closes the endpoint: UCX completes every outstanding operation on it (cancelled) and
// closes its transports, so nothing lands in local memory afterwards. Only when no flush is in
// flight on it (kvb_ep's gate). `wait`: progress the worker until the close completed (false only
// once nothing progresses the worker any more: Destroy).
void ForceClose(kvb_ep *e, bool wait = true) {
  std::unique_lock<std::shared_mutex> g(e->mu);
  if (e->closed) return;
  e->closed = true;
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void *req = ucp_ep_close_nbx(e->ep, &p);
  ucs_status_t st;
  // A forced close completes locally; the bound only guards against a UCX defect.
  if (wait && !Wait(e->ctx, req, Now() + 5000000000LL, &st)) fprintf(stderr, "kvblocks: UCX endpoint close is slow\n");
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) ucp_request_free(req);
}

// Whether a flush finished: its request completed and its callback returned (`f` may go).
bool Finished(const Flushed *f) { return f->done.load() && ucp_request_check_status(f->req) != UCS_INPROGRESS; }

void FreeFlush(Flushed *f) {
  ucp_request_free(f->req);
  delete f;
}

// Frees the flushes of `fs` that finished; true when none is left in flight.
bool DropFinished(std::vector<Flushed *> *fs) {
  size_t k = 0;
  for (Flushed *f : *fs) {
    if (Finished(f)) FreeFlush(f);
    else (*fs)[k++] = f;
  }
  fs->resize(k);
  return k == 0;
}

// No new call starts on the endpoint (a call failed or ran out of time). It is force-closed now
// when no flush is in flight on it; else Close() (or the reaper after it) closes it after the last.
// A call in the ops phase always closes it here: the phases never overlap, and a lingering flush
// retired the endpoint before any call could enter the ops phase.
void Retire(kvb_ep *e) {
  bool close_now;
  {
    std::lock_guard<std::mutex> g(e->gate_mu);
    e->retired = true;
    close_now = e->active[kFlush] == 0 && DropFinished(&e->lingering);
  }
  e->gate_cv.notify_all();
  if (close_now) ForceClose(e);
}

// The endpoints Close() handed over: each is closed once its last flush finished (on the progress
// thread, about every millisecond while any is left).
void Reap(kvb_ctx *c) {
  std::vector<kvb_ep *> graves, left;
  {
    std::lock_guard<std::mutex> g(c->graves_mu);
    graves.swap(c->graves);
  }
  for (kvb_ep *e : graves) {
    bool done;
    {
      std::lock_guard<std::mutex> g(e->gate_mu);
      done = DropFinished(&e->lingering);
    }
    if (!done) {
      left.push_back(e);
      continue;
    }
    ForceClose(e);
    delete e;
  }
  std::lock_guard<std::mutex> g(c->graves_mu);
  c->graves.insert(c->graves.end(), left.begin(), left.end());
  c->ngraves.store(static_cast<int>(c->graves.size()));
}

const char *Version() { return ucp_get_version_string(); }

// Sets UCX option `name` unless the user chose it (UCX_<name> in the environment).
void Default(ucp_config_t *cfg, const char *name, const char *value) {
  char env[64];
  snprintf(env, sizeof(env), "UCX_%s", name);
  if (getenv(env) == nullptr) ucp_config_modify(cfg, name, value);
}

kvb_ctx *Create(const char *net_devices, char *err, size_t errlen) {
  auto *c = new kvb_ctx;
  ucp_config_t *cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) {
    Say(err, errlen, "ucp_config_read", st);
    delete c;
    return nullptr;
  }
  // The worker listens on these interfaces only: whoever reaches it reaches all of this process's
  // memory through UCX's software RMA (README, threat model), so UCX_NET_DEVICES cannot widen it.
  st = ucp_config_modify(cfg, "NET_DEVICES", net_devices);
  if (st != UCS_OK) {
    Say(err, errlen, "UCX_NET_DEVICES", st);
    ucp_config_release(cfg);
    delete c;
    return nullptr;
  }
  // A killed peer must fail a transfer within about a second (UCX's default is much longer).
  Default(cfg, "KEEPALIVE_INTERVAL", "1s");
  // Put stays UCX's peer-mode default, emulated over active messages, whatever the environment
  // says: a zero-copy put (what RNDV_THRESH=inf turns on) crashes UCX 1.22 over tcp when its
  // endpoint is force-closed mid-put and the peer resumes later
  // (test_ucx.py::test_push_to_frozen_peer_times_out). The runtime logs the override.
  ucp_config_modify(cfg, "RNDV_THRESH", "auto");
  // Two rails, as NIXL: a second NIC.
  Default(cfg, "MAX_RMA_RAILS", "2");
  Default(cfg, "MIN_RMA_CHUNK_SIZE", "64K");  // a block-sized op stays on one rail (16 KiB puts: 1.5x)
  // Adaptive progress parks interfaces no local endpoint uses, and a serving side has none of its
  // own: each request then goes through UCX's async thread and a worker signal (+20 us a call, a
  // third of a core). Two or three interfaces are cheap to poll.
  Default(cfg, "ADAPTIVE_PROGRESS", "n");
  // Over tcp, emulated get and put move in segments of this size: 8K by default, which costs a
  // syscall and a message header each (4x slower on 4 MiB pulls).
  Default(cfg, "TCP_TX_SEG_SIZE", "256K");
  Default(cfg, "TCP_RX_SEG_SIZE", "512K");
  ucp_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 1;
  st = ucp_init(&p, cfg, &c->context);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    Say(err, errlen, "ucp_init", st);
    delete c;
    return nullptr;
  }
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(c->context, &wp, &c->worker);
  if (st == UCS_OK) st = ucp_worker_get_address(c->worker, &c->address, &c->address_len);
  if (st == UCS_OK) st = ucp_worker_get_efd(c->worker, &c->efd);
  if (st != UCS_OK) {
    Say(err, errlen, "ucp_worker_create", st);
    if (c->address != nullptr) ucp_worker_release_address(c->worker, c->address);
    if (c->worker != nullptr) ucp_worker_destroy(c->worker);
    ucp_cleanup(c->context);
    delete c;
    return nullptr;
  }
  c->progress = std::thread(ProgressLoop, c);
  return c;
}

void Destroy(kvb_ctx *c) {
  if (c == nullptr) return;
  c->stop.store(true);
  {
    std::lock_guard<std::mutex> g(c->mu);
    c->cv.notify_all();
  }
  ucp_worker_signal(c->worker);
  c->progress.join();
  // Endpoints whose flushes never finished (a peer frozen until now): nothing progresses the worker
  // from here on, so a flush UCX parked on its progress queue never runs on the freed endpoint.
  for (kvb_ep *e : c->graves) {
    ForceClose(e, false);
    for (Flushed *f : e->lingering) FreeFlush(f);  // after the close: it may complete them
    delete e;
  }
  c->graves.clear();
  ucp_worker_release_address(c->worker, c->address);
  ucp_worker_destroy(c->worker);
  ucp_cleanup(c->context);
  delete c;
}

size_t Address(kvb_ctx *c, void *buf, size_t cap) {
  if (c->address_len <= cap) memcpy(buf, c->address, c->address_len);
  return c->address_len;
}

kvb_mem *MemMap(kvb_ctx *c, void *addr, size_t len, uint32_t kind, int32_t, char *err, size_t errlen) {
  if (kind != KVB_MEM_HOST) {  // UCP could map CUDA memory with UCS_MEMORY_TYPE_CUDA; not built or tested here
    if (err != nullptr && errlen != 0) snprintf(err, errlen, "this UCX plugin maps host memory only (kind %u)", kind);
    return nullptr;
  }
  ucp_mem_map_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = addr;
  p.length = len;
  auto *m = new kvb_mem{c, nullptr};
  ucs_status_t st = ucp_mem_map(c->context, &p, &m->memh);
  if (st != UCS_OK) {
    Say(err, errlen, "ucp_mem_map", st);
    delete m;
    return nullptr;
  }
  st = ucp_rkey_pack(c->context, m->memh, &m->rkey, &m->rkey_len);
  if (st != UCS_OK) {
    Say(err, errlen, "ucp_rkey_pack", st);
    ucp_mem_unmap(c->context, m->memh);
    delete m;
    return nullptr;
  }
  return m;
}

size_t MemRkey(kvb_mem *m, void *buf, size_t cap) {
  if (m->rkey_len <= cap) memcpy(buf, m->rkey, m->rkey_len);
  return m->rkey_len;
}

void MemUnmap(kvb_mem *m) {
  if (m == nullptr) return;
  ucp_rkey_buffer_release(m->rkey);
  ucp_mem_unmap(m->ctx->context, m->memh);
  delete m;
}

kvb_ep *Connect(kvb_ctx *c, const void *addr, size_t len, char *err, size_t errlen) {
  (void)len;  // the address is self-describing; its length was checked by the table decoder
  auto *e = new kvb_ep;
  e->ctx = c;
  ucp_ep_params_t p;
  memset(&p, 0, sizeof(p));
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = static_cast<const ucp_address_t *>(addr);
  // Peer mode: a dead peer fails the endpoint (and a forced close is allowed). UCX then uses only
  // transports that detect peer failure (tcp, and on RDMA hosts rc/dc; not shared memory alone).
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = OnError;
  p.err_handler.arg = e;
  const ucs_status_t st = ucp_ep_create(c->worker, &p, &e->ep);
  if (st != UCS_OK) {
    Say(err, errlen, "ucp_ep_create", st);
    delete e;
    return nullptr;
  }
  return e;
}

kvb_rkey *RkeyUnpack(kvb_ep *e, const void *buf, size_t) {
  std::shared_lock<std::shared_mutex> g(e->mu);
  if (e->closed) return nullptr;
  ucp_rkey_h h;
  if (ucp_ep_rkey_unpack(e->ep, buf, &h) != UCS_OK) return nullptr;
  return new kvb_rkey{h};
}

void RkeyDestroy(kvb_rkey *r) {
  if (r == nullptr) return;
  ucp_rkey_destroy(r->rkey);
  delete r;
}

// The flush's completion, wherever it runs: the progress thread may complete it while the caller
// sleeps on the worker's event fd, so it wakes the caller rather than leave it to its poll timeout.
// Only when a caller sleeps: a signal also wakes a progress thread asleep on the same fd.
void OnFlushed(void *, ucs_status_t, void *arg) {
  auto *f = static_cast<Flushed *>(arg);
  kvb_ctx *c = f->ctx;  // f may be freed once done is set (Finished)
  f->done.store(true);
  if (c->sleepers.load() > 0) ucp_worker_signal(c->worker);
}

void FreeAll(std::vector<void *> *reqs) {
  for (void *r : *reqs) ucp_request_free(r);
  reqs->clear();
}

// Enters `phase` of the endpoint's gate: the ops phase waits while a flush is in flight or waiting,
// the flush phase while operations are. KVB_OK, or why not.
int Enter(kvb_ep *e, Phase phase, int64_t deadline, int (*keep_going)(void *), void *arg, char *err, size_t errlen) {
  std::unique_lock<std::mutex> g(e->gate_mu);
  ++e->waiting[phase];
  int out = KVB_OK;
  for (;;) {
    if (e->retired || e->failed.load()) {
      out = KVB_FAILED;
      if (err != nullptr && errlen != 0) snprintf(err, errlen, "the UCX endpoint has failed or was closed");
      break;
    }
    if (phase == kFlush ? e->active[kOps] == 0 : e->active[kFlush] == 0 && e->waiting[kFlush] == 0) break;
    const int64_t now = Now();
    if (now >= deadline) {
      out = KVB_TIMEOUT;
      break;
    }
    if (keep_going != nullptr && !keep_going(arg)) {
      out = KVB_ABORTED;
      break;
    }
    e->gate_cv.wait_for(g, std::chrono::nanoseconds(std::min<int64_t>(deadline - now, 1000000)));
  }
  --e->waiting[phase];
  if (out == KVB_OK) ++e->active[phase];
  g.unlock();
  if (out != KVB_OK) e->gate_cv.notify_all();  // a flush that gave up no longer holds operations back
  return out;
}

void Leave(kvb_ep *e, Phase phase) {
  {
    std::lock_guard<std::mutex> g(e->gate_mu);
    --e->active[phase];
  }
  e->gate_cv.notify_all();
}

// Posts every op; the requests still in flight go to `reqs`.
int Post(kvb_ep *e, kvb_rkey *const *rkeys, size_t nrkeys, kvb_mem *const *lmems, size_t nlmems, const kvb_op *ops,
         size_t n, int get, std::vector<void *> *reqs, char *err, size_t errlen) {
  std::shared_lock<std::shared_mutex> g(e->mu);
  if (e->closed || e->failed.load()) {
    if (err != nullptr && errlen != 0) snprintf(err, errlen, "the UCX endpoint has failed or was closed");
    return KVB_FAILED;
  }
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  for (size_t i = 0; i < n; ++i) {
    const kvb_op &o = ops[i];
    if (o.rkey >= nrkeys || (o.lmem != KVB_NO_MEM && o.lmem >= nlmems)) {
      Say(err, errlen, get ? "ucp_get_nbx" : "ucp_put_nbx", UCS_ERR_INVALID_PARAM);
      return KVB_FAILED;
    }
    // one of many (a lane hint), and the local mapping when known (no registration lookup)
    p.op_attr_mask = UCP_OP_ATTR_FLAG_MULTI_SEND;
    if (o.lmem != KVB_NO_MEM) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = lmems[o.lmem]->memh;
    }
    void *r = get ? ucp_get_nbx(e->ep, reinterpret_cast<void *>(o.local), o.len, o.remote, rkeys[o.rkey]->rkey, &p)
                  : ucp_put_nbx(e->ep, reinterpret_cast<void *>(o.local), o.len, o.remote, rkeys[o.rkey]->rkey, &p);
    if (UCS_PTR_IS_ERR(r)) {
      Say(err, errlen, get ? "ucp_get_nbx" : "ucp_put_nbx", UCS_PTR_STATUS(r));
      return KVB_FAILED;
    }
    if (r != nullptr) reqs->push_back(r);
  }
  return KVB_OK;
}

// Why a wait stops early, checked about every millisecond: the peer failed, or the caller says stop.
int Interrupted(kvb_ep *e, int64_t now, int64_t *next_check, int (*keep_going)(void *), void *arg) {
  if (now < *next_check) return KVB_OK;
  *next_check = now + 1000000;
  if (e->failed.load()) return KVB_FAILED;
  if (keep_going != nullptr && !keep_going(arg)) return KVB_ABORTED;
  return KVB_OK;
}

// Waits for every request of `reqs`: a get's data has landed, a put's source is no longer needed
// (its data may still be on its way).
int AwaitOps(kvb_ep *e, Waiter *w, const std::vector<void *> &reqs, int64_t deadline, int (*keep_going)(void *),
             void *arg, char *err, size_t errlen) {
  static const std::atomic<bool> kNever{false};  // no callback: the worker's events wake a sleeper
  int64_t next_check = 0;
  for (size_t i = 0; i < reqs.size();) {
    const ucs_status_t st = ucp_request_check_status(reqs[i]);
    if (st == UCS_OK) {
      ++i;
      continue;
    }
    if (st != UCS_INPROGRESS) {
      Say(err, errlen, "operation", st);
      return KVB_FAILED;
    }
    const int64_t now = Now();
    if (now >= deadline) return KVB_TIMEOUT;
    const int out = Interrupted(e, now, &next_check, keep_going, arg);
    if (out != KVB_OK) return out;
    w->Step(now, kNever);
  }
  return KVB_OK;
}

// Posts the endpoint's flush; KVB_OK with f->req the request, or nullptr when it finished at once.
int PostFlush(kvb_ep *e, Flushed *f, char *err, size_t errlen) {
  std::shared_lock<std::shared_mutex> g(e->mu);
  if (e->closed || e->failed.load()) {
    if (err != nullptr && errlen != 0) snprintf(err, errlen, "the UCX endpoint has failed or was closed");
    return KVB_FAILED;
  }
  ucp_request_param_t p;
  memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = OnFlushed;
  p.user_data = f;
  void *r = ucp_ep_flush_nbx(e->ep, &p);
  if (UCS_PTR_IS_ERR(r)) {
    Say(err, errlen, "ucp_ep_flush_nbx", UCS_PTR_STATUS(r));
    return KVB_FAILED;
  }
  f->req = r;
  return KVB_OK;
}

// Waits for a posted flush; KVB_OK when it finished (then its status), else why it stopped waiting.
int AwaitFlush(kvb_ep *e, Waiter *w, Flushed *f, int64_t deadline, int (*keep_going)(void *), void *arg, char *err,
               size_t errlen) {
  int64_t next_check = 0;
  while (!Finished(f)) {
    const int64_t now = Now();
    if (now >= deadline) return KVB_TIMEOUT;
    const int out = Interrupted(e, now, &next_check, keep_going, arg);
    if (out != KVB_OK) return out;
    w->Step(now, f->done);
  }
  const ucs_status_t st = ucp_request_check_status(f->req);
  if (st == UCS_OK) return KVB_OK;
  Say(err, errlen, "flush", st);
  return KVB_FAILED;
}

// The flush phase of a put: posted once every put completed locally, so a call that times out here
// has nothing left to cancel. Its flush then lingers on the endpoint until it finishes, and the
// endpoint is retired, never closed under it.
int Flush(kvb_ep *e, Waiter *w, int64_t deadline, int (*keep_going)(void *), void *arg, char *err, size_t errlen) {
  int out = Enter(e, kFlush, deadline, keep_going, arg, err, errlen);
  if (out != KVB_OK) {
    Retire(e);
    return out;
  }
  auto *f = new Flushed{e->ctx};
  out = PostFlush(e, f, err, errlen);
  if (out == KVB_OK && f->req != nullptr) {
    out = AwaitFlush(e, w, f, deadline, keep_going, arg, err, errlen);
    if (Finished(f)) {
      FreeFlush(f);
      f = nullptr;
    }
  } else {  // not posted, or finished at once: no callback comes
    delete f;
    f = nullptr;
  }
  {
    std::lock_guard<std::mutex> g(e->gate_mu);
    if (f != nullptr) e->lingering.push_back(f);
    --e->active[kFlush];
  }
  e->gate_cv.notify_all();
  if (out != KVB_OK) Retire(e);
  return out;
}

int Run(kvb_ep *e, kvb_rkey *const *rkeys, size_t nrkeys, kvb_mem *const *lmems, size_t nlmems,
        const kvb_op *ops, size_t n, int get, int64_t deadline, int (*keep_going)(void *), void *arg, char *err,
        size_t errlen) {
  int out = Enter(e, kOps, deadline, keep_going, arg, err, errlen);
  if (out != KVB_OK) {
    Retire(e);
    return out;
  }
  Waiter waiter(e->ctx);  // from the first post: posting large puts is most of the sending
  std::vector<void *> reqs;
  out = Post(e, rkeys, nrkeys, lmems, nlmems, ops, n, get, &reqs, err, errlen);
  if (out == KVB_OK) out = AwaitOps(e, &waiter, reqs, deadline, keep_going, arg, err, errlen);
  if (out != KVB_OK) Retire(e);  // in the ops phase: closes, cancelling what is still in flight
  FreeAll(&reqs);
  Leave(e, kOps);
  // A get's data is here once its request completed; a put's needs the flush.
  if (out != KVB_OK || get) return out;
  return Flush(e, &waiter, deadline, keep_going, arg, err, errlen);
}

// Closes and frees the endpoint; one with a flush still in flight is handed to the reaper, which
// closes it once the flush finished (its error handler's argument, `e`, lives until then).
void Close(kvb_ep *e) {
  if (e == nullptr) return;
  bool in_flight;
  {
    std::lock_guard<std::mutex> g(e->gate_mu);
    e->retired = true;
    in_flight = e->active[kFlush] > 0 || !DropFinished(&e->lingering);
  }
  if (!in_flight) {
    ForceClose(e);
    delete e;
    return;
  }
  kvb_ctx *c = e->ctx;
  std::lock_guard<std::mutex> g(c->graves_mu);
  c->graves.push_back(e);
  c->ngraves.store(static_cast<int>(c->graves.size()));
}

const kvb_backend_api kApi = {KVB_BACKEND_ABI_VERSION, "ucx", 1u << KVB_MEM_HOST, Version, Create, Destroy,
                             Address, MemMap, MemRkey, MemUnmap, Connect, RkeyUnpack, RkeyDestroy, Run, Close};

}  // namespace

extern "C" __attribute__((visibility("default"))) const kvb_backend_api *kvblocks_backend_api(void) { return &kApi; }
