// SPDX-License-Identifier: Apache-2.0
// Layer-wise pushes (include/kvblocks/layerwise.h): the open runs every check and builds one plan
// per layer (engine/checks.h); each LayerReady queues its layer, and a sender thread of this part's
// pool sends the queued layers in order (Executor::RunLayer), taking the engine, cache and link
// locks per layer only.
#ifndef KVBLOCKS_RUNTIME_ENGINE_LAYERWISE_H_
#define KVBLOCKS_RUNTIME_ENGINE_LAYERWISE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kvblocks/ext_types.h"
#include "kvblocks/layerwise.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

class Checks;
class Executor;
class LayerPool;
struct LayerPushState;

class LayerWise {
 public:
  // `wait_ms`: llm.SyncKvCacheWaitTime, each layer's deadline under per_layer_deadline.
  LayerWise(Checks *checks, Executor *exec, const int64_t *wait_ms) : checks_(checks), exec_(exec), wait_ms_(wait_ms) {}
  // Stops the sender pool (runs what is queued, joins) before the engine's other parts go; later
  // layers are refused.
  ~LayerWise();
  LayerWise(const LayerWise &) = delete;
  LayerWise &operator=(const LayerWise &) = delete;

  // A push of blocks, every layer's tensor_num_per_layer tensors: the checks of PushKvBlocks
  // (Checks::LayerBlocks: LLM_FAILED, LLM_PARAM_INVALID, LLM_KV_CACHE_NOT_EXIST, LLM_NOT_YET_LINK).
  llm_datadist::Status Open(const llm_datadist::Cache &src, const llm_datadist::CacheIndex &dst,
                            const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                            uint8_t tensor_num_per_layer, LayerPush *out);
  // A push of pieces (byte ranges of tensor pairs) in `num_layers` layers: Checks::LayerBase, then
  // each piece (Checks::AddLayerPiece); LLM_PARAM_INVALID when num_layers is 0.
  llm_datadist::Status OpenPieces(const llm_datadist::Cache &src, uint64_t dst_cluster_id, uint32_t num_layers,
                                  const std::vector<LayerPiece> &pieces, bool per_layer_deadline, LayerPush *out);

 private:
  llm_datadist::Status Publish(std::shared_ptr<LayerPushState> core, LayerPush *out);

  Checks *const checks_;
  Executor *const exec_;
  const int64_t *const wait_ms_;
  std::mutex mu_;
  std::shared_ptr<LayerPool> pool_;  // started on first use
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_LAYERWISE_H_
