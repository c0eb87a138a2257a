// SPDX-License-Identifier: Apache-2.0
// The state of a layer-wise push (include/kvblocks/layerwise.h), shared by checks.cc (which
// builds its plans) and layerwise.cc (which sends them). No engine header.
#ifndef KVBLOCKS_RUNTIME_ENGINE_LAYER_PUSH_H_
#define KVBLOCKS_RUNTIME_ENGINE_LAYER_PUSH_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/transfer.h"
#include "kvblocks/layerwise.h"
#include "llm_datadist/llm_datadist.h"
#include "plan/plan.h"

namespace kvblocks {

class LayerPool;

// One plan of a layer, run on the transfer (remote cache) `transfer` of the push.
struct LayerItem {
  size_t transfer;
  Plan plan;
};

struct LayerPushState {
  std::weak_ptr<LayerPushState> self;  // the senders' reference (handles hold another, see PublishLayerPush)
  std::shared_ptr<LayerPool> pool;
  std::vector<TransferPtr> ts;                 // detached; touched only by the sender
  std::vector<std::vector<LayerItem>> layers;  // what each layer sends
  bool per_layer_deadline = false;  // transfer_cache_async: each layer's deadline runs from its ready call
  int64_t wait_ns = 0;              // llm.SyncKvCacheWaitTime
  int64_t deadline = 0;             // from the open

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<uint8_t> marked;    // layer made ready
  std::vector<int64_t> ready_at;  // NowNs() of each ready call
  std::vector<uint32_t> order;    // layers in ready order; [head, tail) still to send
  size_t head = 0, tail = 0;
  int64_t last_ready = 0;
  bool running = false;  // a pool thread is sending
  bool closed = false;   // no more layers are sent
  bool ended = false;    // `status` is final
  llm_datadist::Status status = llm_datadist::LLM_WAIT_PROC_TIMEOUT;
  std::string message;
  uint32_t sent = 0;
  std::atomic<bool> done{false};  // ended && !running
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_LAYER_PUSH_H_
