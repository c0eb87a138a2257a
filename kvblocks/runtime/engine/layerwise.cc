// SPDX-License-Identifier: Apache-2.0
// Layer-wise pushes (engine/layerwise.h): the open runs every check and builds one plan per layer
// (engine/checks.h); each LayerReady queues its layer, and a pool thread sends the queued layers in
// order, taking the engine, cache and link locks per layer only. Finish waits under the push's deadline; a push that
// returned (or was aborted) has no layer in flight, so no byte of the destination changes later.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <system_error>
#include <thread>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "engine/checks.h"
#include "engine/executor.h"
#include "engine/layer_push.h"
#include "engine/layerwise.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants and API types

namespace {

// Under s.mu: the push's final status (the first one wins).
void EndLocked(LayerPushState &s, Status st, const char *why) {
  s.closed = true;
  if (s.ended) return;
  s.ended = true;
  s.status = st;
  if (st != LLM_SUCCESS) s.message = why;
}

// Under s.mu, once the push ended and no layer is in flight: the transfers (cache, link references)
// go now rather than with the last handle.
void SettleLocked(LayerPushState &s) {
  if (!s.ended || s.running) return;
  s.ts.clear();
  s.done.store(true, std::memory_order_release);
  s.cv.notify_all();
}

}  // namespace

// Sender threads, started on demand up to kMaxAsyncThreads. Stop() (the engine's destructor) runs
// what is queued and joins; afterwards Post refuses, so no sender touches a destroyed engine.
class LayerPool {
 public:
  explicit LayerPool(Executor *exec) : exec_(exec) {}
  ~LayerPool() { Stop(); }

  bool Post(std::shared_ptr<LayerPushState> s) {
    bool wake;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return false;
      if (q_.size() + 1 > idle_ && threads_.size() < kMaxAsyncThreads) {
        try {
          threads_.emplace_back([this] { Loop(); });
        } catch (const std::system_error &) {
          if (threads_.empty()) return false;
        }
      }
      q_.push_back(std::move(s));
      wake = idle_ > 0;
    }
    if (wake) cv_.notify_one();
    return true;
  }

  void Stop() {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
      ts.swap(threads_);
    }
    cv_.notify_all();
    for (auto &t : ts) t.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (q_.empty()) {
        if (stop_) return;
        ++idle_;
        cv_.wait(lk, [this] { return stop_ || !q_.empty(); });
        --idle_;
        continue;
      }
      std::shared_ptr<LayerPushState> s = std::move(q_.front());
      q_.pop_front();
      lk.unlock();
      Send(*s);
      s.reset();
      lk.lock();
    }
  }

  // Sends the queued layers of one push until none is left (or the push closed).
  void Send(LayerPushState &s) {
    std::unique_lock<std::mutex> lk(s.mu);
    for (;;) {
      if (s.closed || s.head == s.tail) {
        s.running = false;
        SettleLocked(s);
        s.cv.notify_all();
        return;
      }
      const uint32_t l = s.order[s.head++];
      const int64_t deadline = s.per_layer_deadline ? s.ready_at[l] + s.wait_ns : s.deadline;
      lk.unlock();
      std::string why;
      const Status st = SendLayer(s, l, deadline, &why);
      lk.lock();
      if (st != LLM_SUCCESS) {
        EndLocked(s, st, why.c_str());
      } else if (++s.sent == s.layers.size()) {
        EndLocked(s, LLM_SUCCESS, "");
      }
      s.cv.notify_all();
    }
  }

  Status SendLayer(LayerPushState &s, uint32_t l, int64_t deadline, std::string *why) {
    ClearLastError();
    Status st = LLM_SUCCESS;
    try {
      for (LayerItem &it : s.layers[l]) {
        st = exec_->RunLayer(s.ts[it.transfer].get(), &it.plan, deadline);
        if (st != LLM_SUCCESS) break;
      }
    } catch (const std::bad_alloc &) {
      st = Fail(LLM_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception &e) {
      st = Fail(LLM_FAILED, "internal error: %s", e.what());
    }
    if (st != LLM_SUCCESS) *why = std::string("layer ") + std::to_string(l) + ": " + LastErrorMessage();
    return st;
  }

  Executor *const exec_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<LayerPushState>> q_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

LayerWise::~LayerWise() {
  if (pool_) pool_->Stop();
}

Status LayerWise::Publish(std::shared_ptr<LayerPushState> core, LayerPush *out) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!pool_) pool_ = std::make_shared<LayerPool>(exec_);
    core->pool = pool_;
  }
  const size_t n = core->layers.size();
  core->self = core;
  core->wait_ns = *wait_ms_ * kMsNs;
  core->marked.assign(n, 0);
  core->ready_at.assign(n, 0);
  core->order.assign(n, 0);
  core->last_ready = NowNs();
  if (n == 0) EndLocked(*core, LLM_SUCCESS, "");  // nothing to send (not reachable from the checks)
  // The handle's reference aborts the push when the last copy goes; the sender holds `core`.
  LayerPushState *raw = core.get();
  *out = LayerPush(std::shared_ptr<LayerPushState>(raw, [core](LayerPushState *s) {
    std::lock_guard<std::mutex> g(s->mu);
    EndLocked(*s, LLM_FAILED, "the layer-wise push was dropped before it finished");
    SettleLocked(*s);
  }));
  return LLM_SUCCESS;
}

Status LayerWise::Open(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                       const std::vector<uint64_t> &dst_blocks, uint8_t tensor_num_per_layer, LayerPush *out) {
  TransferPtr t = NewTransfer();
  std::vector<Plan> plans;
  const Status st = checks_->LayerBlocks(t.get(), src, dst, src_blocks, dst_blocks, tensor_num_per_layer, &plans);
  if (st != LLM_SUCCESS) return st;  // `t` unlocks on this thread
  auto core = std::make_shared<LayerPushState>();
  core->deadline = t->deadline;
  core->layers.resize(plans.size());
  for (size_t l = 0; l < plans.size(); ++l) core->layers[l].push_back(LayerItem{0, std::move(plans[l])});
  Executor::Detach(t.get());
  core->ts.push_back(std::move(t));
  return Publish(std::move(core), out);
}

Status LayerWise::OpenPieces(const Cache &src, uint64_t dst_cluster_id, uint32_t num_layers,
                             const std::vector<LayerPiece> &pieces, bool per_layer_deadline, LayerPush *out) {
  TransferPtr base = NewTransfer();
  Status st;
  if ((st = checks_->LayerBase(base.get(), src, dst_cluster_id)) != LLM_SUCCESS) return st;
  if (num_layers == 0) return Fail(LLM_PARAM_INVALID, "a layer-wise push needs at least one layer");
  auto core = std::make_shared<LayerPushState>();
  core->layers.resize(num_layers);
  for (const LayerPiece &pc : pieces)
    if ((st = checks_->AddLayerPiece(base.get(), pc, &core->ts, &core->layers)) != LLM_SUCCESS) return st;
  core->deadline = base->deadline;
  core->per_layer_deadline = per_layer_deadline;
  Executor::Detach(base.get());
  return Publish(std::move(core), out);
}

// ------------------------------------------------------------------ LayerPush
uint32_t LayerPush::NumLayers() const noexcept { return s_ ? static_cast<uint32_t>(s_->layers.size()) : 0; }

llm_datadist::Status LayerPush::LayerReady(uint32_t layer) noexcept {
  ClearLastError();
  if (!s_) return Fail(LLM_FAILED, "empty layer-wise push handle");
  LayerPushState &s = *s_;
  bool post;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.closed)
      return s.status != LLM_SUCCESS && s.status != LLM_WAIT_PROC_TIMEOUT
                 ? Fail(s.status, "the layer-wise push failed: %s", s.message.c_str())
                 : Fail(LLM_PARAM_INVALID, "the layer-wise push is finished");
    if (layer >= s.layers.size())
      return Fail(LLM_PARAM_INVALID, "layer %u is out of range (%zu layers)", layer, s.layers.size());
    if (s.marked[layer]) return Fail(LLM_PARAM_INVALID, "layer %u was already made ready", layer);
    s.marked[layer] = 1;
    s.last_ready = s.ready_at[layer] = NowNs();
    s.order[s.tail++] = layer;
    post = !s.running;
    s.running = true;
  }
  std::shared_ptr<LayerPool> pool = s.pool;
  bool posted = false;
  if (post) {
    try {
      // The sender's reference is the core's, not this handle's (which aborts when dropped).
      std::shared_ptr<LayerPushState> core = s.self.lock();
      posted = core && pool->Post(std::move(core));
    } catch (...) {
    }
  }
  if (post && !posted) {
    std::lock_guard<std::mutex> g(s.mu);
    s.running = false;
    EndLocked(s, LLM_FAILED, "the engine is gone or no sender thread could be started");
    SettleLocked(s);
    return Fail(LLM_FAILED, "the engine is gone or no sender thread could be started");
  }
  return LLM_SUCCESS;
}

llm_datadist::Status LayerPush::Finish(int64_t timeout_ms) noexcept {
  ClearLastError();
  if (!s_) return Fail(LLM_FAILED, "empty layer-wise push handle");
  LayerPushState &s = *s_;
  const int64_t caller_end = timeout_ms < 0 ? INT64_MAX : NowNs() + timeout_ms * kMsNs;
  std::unique_lock<std::mutex> lk(s.mu);
  for (;;) {
    if (s.ended && !s.running) break;
    const int64_t deadline = s.per_layer_deadline ? s.last_ready + s.wait_ns : s.deadline;
    const int64_t now = NowNs();
    if (now >= caller_end && caller_end < deadline) return LLM_WAIT_PROC_TIMEOUT;
    if (now >= deadline && !s.ended) {
      char why[160];
      snprintf(why, sizeof why, "%u of %zu layers were sent within llm.SyncKvCacheWaitTime=%lld ms; the others "
               "were abandoned", s.sent, s.layers.size(), static_cast<long long>(s.wait_ns / kMsNs));
      EndLocked(s, LLM_TIMEOUT, why);
      continue;  // waits for the layer in flight, which ends by the same deadline
    }
    const int64_t until = std::min(caller_end, s.ended ? now + 10 * kMsNs : deadline);
    s.cv.wait_for(lk, std::chrono::nanoseconds(std::max<int64_t>(until - now, 0)));
  }
  SettleLocked(s);
  if (s.status != LLM_SUCCESS) return Fail(s.status, "%s", s.message.c_str());
  return LLM_SUCCESS;
}

llm_datadist::Status LayerPush::Abort() noexcept {
  ClearLastError();
  if (!s_) return Fail(LLM_FAILED, "empty layer-wise push handle");
  LayerPushState &s = *s_;
  std::unique_lock<std::mutex> lk(s.mu);
  EndLocked(s, LLM_FAILED, "the layer-wise push was aborted");
  s.cv.wait(lk, [&s] { return !s.running; });
  SettleLocked(s);
  return s.status;
}

llm_datadist::Status LayerPush::Drain() noexcept {
  ClearLastError();
  if (!s_) return Fail(LLM_FAILED, "empty layer-wise push handle");
  LayerPushState &s = *s_;
  std::unique_lock<std::mutex> lk(s.mu);
  s.cv.wait(lk, [&s] { return !s.running && (s.ended || s.head == s.tail); });
  return s.ended ? s.status : LLM_WAIT_PROC_TIMEOUT;
}

bool LayerPush::Done() const noexcept { return !s_ || s_->done.load(std::memory_order_acquire); }

llm_datadist::Status LayerPush::Status() const noexcept {
  if (!s_) return LLM_FAILED;
  return s_->done.load(std::memory_order_acquire) ? s_->status : LLM_WAIT_PROC_TIMEOUT;
}

uint32_t LayerPush::LayersSent() const noexcept {
  if (!s_) return 0;
  std::lock_guard<std::mutex> g(s_->mu);
  return s_->sent;
}

const char *LayerPush::Message() const noexcept {
  if (!s_) return "empty layer-wise push handle";
  return s_->done.load(std::memory_order_acquire) ? s_->message.c_str() : "";
}

}  // namespace kvblocks
