// SPDX-License-Identifier: Apache-2.0
// Layer-wise push: a kvblocks extension. A push is opened once for a request (every check of
// PushKvBlocks runs then, with its statuses), told layer by layer that a layer of the source is
// final, and finished. Each ready layer is sent on a runtime thread while the caller computes the
// next ones; finishing waits for the last layer.
#ifndef KVBLOCKS_LAYERWISE_H_
#define KVBLOCKS_LAYERWISE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kvblocks/ext_types.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct LayerPushState;

// An open layer-wise push. Copies share it; any thread may call any method. Dropping every copy
// aborts it (as Abort(), without waiting). An empty handle reports LLM_FAILED.
class KVBLOCKS_API LayerPush {
 public:
  LayerPush() noexcept = default;
  explicit LayerPush(std::shared_ptr<LayerPushState> s) noexcept : s_(std::move(s)) {}

  bool Valid() const noexcept { return s_ != nullptr; }
  uint32_t NumLayers() const noexcept;
  // Layer `layer` of the source is final: it is queued and sent by a runtime thread, in the order
  // the layers are made ready. Costs one lock (and a thread wake-up when the sender is idle); never
  // blocks on the transfer. LLM_PARAM_INVALID for a layer out of range or already made ready, or
  // once the push is finished, aborted or failed (the failure is then the push's status).
  llm_datadist::Status LayerReady(uint32_t layer) noexcept;
  // Waits until every layer was sent and returns the push's status. The deadline
  // (llm.SyncKvCacheWaitTime) runs from the open; `timeout_ms` >= 0 only shortens the wait (the
  // push is then still open: LLM_WAIT_PROC_TIMEOUT). When the deadline passes first the layers not
  // sent are abandoned and it returns LLM_TIMEOUT once no byte of the destination changes any more.
  llm_datadist::Status Finish(int64_t timeout_ms = -1) noexcept;
  // No more layers: those not started are skipped; returns once the one in flight (if any) has
  // ended, so no byte of the destination changes afterwards. The status becomes LLM_FAILED unless
  // the push had already ended.
  llm_datadist::Status Abort() noexcept;
  // Waits until the layers made ready so far have been sent (or the push ended) and nothing is in
  // flight; the push stays open. Returns its status (LLM_WAIT_PROC_TIMEOUT while open).
  llm_datadist::Status Drain() noexcept;
  // True once no layer is queued or in flight and the push has ended (all sent, failed, aborted).
  bool Done() const noexcept;
  // The push's status once Done(); LLM_WAIT_PROC_TIMEOUT while it is open.
  llm_datadist::Status Status() const noexcept;
  uint32_t LayersSent() const noexcept;  // layers that landed
  const char *Message() const noexcept;  // why it failed ("" otherwise); valid while the handle lives

 private:
  std::shared_ptr<LayerPushState> s_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_LAYERWISE_H_
