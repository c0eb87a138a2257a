// SPDX-License-Identifier: Apache-2.0
// Every precondition of a transfer, in CANN's order (../spec/llm_datadist.md 3.10-3.13), one
// function per kind; each ends with the transfer's plan. Every check runs before the first byte
// moves, so a failed call changes no memory. The checks see the engine through CheckView only.
#ifndef KVBLOCKS_RUNTIME_ENGINE_CHECKS_H_
#define KVBLOCKS_RUNTIME_ENGINE_CHECKS_H_

#include <atomic>
#include <cstdint>
#include <shared_mutex>
#include <vector>

#include "engine/transfer.h"
#include "kvblocks/ext_types.h"
#include "kvblocks/layout.h"
#include "kvblocks/rules.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

class CacheRegistry;
class LinkRegistry;
class LateCaches;
struct LayerItem;

// What the checks read of the engine that owns them.
struct CheckView {
  uint64_t cluster_id;                                 // this engine's
  std::shared_mutex *state_mu;                         // held shared by a transfer (Begin)
  const std::atomic<bool> *initialized;                // initialized and not finalized
  const std::atomic<llm_datadist::LlmRole> *role;      // checked when *role_check
  const bool *role_check;                              // kvblocks.RoleCheck=1: V1 roles
  const int64_t *wait_ms;                              // llm.SyncKvCacheWaitTime: the deadline
  CacheRegistry *caches;                               // local caches
  LinkRegistry *links;                                 // links by cluster id
  LateCaches *late;                                    // remote caches registered after linking
};

class Checks {
 public:
  explicit Checks(const CheckView &v) : v_(v) {}

  // The kinds. On success `t` holds the engine's state lock (shared), the local cache, the link,
  // the remote cache and the plan; on failure the status is set as the last error. Each returns
  // LLM_FAILED (not initialized), LLM_PARAM_INVALID, LLM_KV_CACHE_NOT_EXIST, LLM_NOT_YET_LINK, or a
  // late cache lookup's LLM_TIMEOUT / LLM_LINK_FAILED.
  // PullKvBlocks (3.11); `xf`: a layout transform (plan/layout.h) instead of equal block sizes and
  // list lengths.
  llm_datadist::Status PullBlocks(Transfer *t, const llm_datadist::CacheIndex &src, const llm_datadist::Cache &dst,
                                  const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                  const llm_datadist::KvCacheExtParam &ext, const LayoutTransform *xf = nullptr);
  // PushKvBlocks (3.13).
  llm_datadist::Status PushBlocks(Transfer *t, const llm_datadist::Cache &src, const llm_datadist::CacheIndex &dst,
                                  const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                  const llm_datadist::KvCacheExtParam &ext, const LayoutTransform *xf = nullptr);
  // PullBlocks or PushBlocks, `remote` and `local` as the direction names them.
  llm_datadist::Status Blocks(Transfer *t, bool pull, const llm_datadist::CacheIndex &remote,
                              const llm_datadist::Cache &local, const std::vector<uint64_t> &src,
                              const std::vector<uint64_t> &dst, const llm_datadist::KvCacheExtParam &ext,
                              const LayoutTransform *xf = nullptr);
  // PullKvCache (3.10).
  llm_datadist::Status PullCache(Transfer *t, const llm_datadist::CacheIndex &src, const llm_datadist::Cache &dst,
                                 uint32_t batch_index, int64_t size, const llm_datadist::KvCacheExtParam &ext);
  // PushKvCache (3.12).
  llm_datadist::Status PushCache(Transfer *t, const llm_datadist::Cache &src, const llm_datadist::CacheIndex &dst,
                                 uint32_t src_batch_index, int64_t size, const llm_datadist::KvCacheExtParam &ext);
  // A remote batch row cut into local blocks (kvblocks' extension; PullKvBlocks' order).
  llm_datadist::Status PullRowToBlocks(Transfer *t, const llm_datadist::CacheIndex &src,
                                       const llm_datadist::Cache &dst, const std::vector<uint64_t> &dst_blocks,
                                       const llm_datadist::KvCacheExtParam &ext);
  // Layer-wise push of blocks (include/kvblocks/layerwise.h): every check of PushBlocks over all
  // layers, then one plan per layer (its tnpl tensors, every block) in `layers`.
  llm_datadist::Status LayerBlocks(Transfer *t, const llm_datadist::Cache &src, const llm_datadist::CacheIndex &dst,
                                   const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                                   uint8_t tnpl, std::vector<Plan> *layers);
  // Layer-wise push of pieces: the engine-wide checks of a push (state, role, placement, local
  // cache, link) into `t`, then each piece (AddLayerPiece) against both tables.
  llm_datadist::Status LayerBase(Transfer *t, const llm_datadist::Cache &src, uint64_t dst_cluster_id);
  // One piece, added to the transfer of its remote cache in `ts` (detached; made when new) and to
  // its layer in `layers`.
  llm_datadist::Status AddLayerPiece(Transfer *base, const LayerPiece &pc, std::vector<TransferPtr> *ts,
                                     std::vector<std::vector<LayerItem>> *layers);

  // The steps the kinds share, for the other entry points (prepared transfers, ranges, lookups).
  // The state lock, initialized, role (when role checks are on), and the deadline.
  llm_datadist::Status Begin(Transfer *t, bool pull);
  llm_datadist::Status Role(bool pull) const;  // LLM_PARAM_INVALID under kvblocks.RoleCheck=1
  llm_datadist::Status FindLocal(Transfer *t, int64_t cache_id);       // LLM_KV_CACHE_NOT_EXIST
  llm_datadist::Status FindLink(Transfer *t, uint64_t cluster_id);     // LLM_NOT_YET_LINK
  // The link-time table, then a cache the peer registered later (asked once): LLM_KV_CACHE_NOT_EXIST,
  // LLM_TIMEOUT, LLM_LINK_FAILED. Holds a RemoteUse in t->remote_use.
  llm_datadist::Status FindRemote(Transfer *t, int64_t cache_id);

 private:
  llm_datadist::Status PullIntoBlocks(Transfer *t, const llm_datadist::CacheIndex &src,
                                      const llm_datadist::Cache &dst, const std::vector<uint64_t> &dst_blocks,
                                      const llm_datadist::KvCacheExtParam &ext, bool *explicit_range,
                                      TensorSpan *span);
  llm_datadist::Status ResolvePiece(const Transfer &base, const LayerPiece &pc, int64_t *cache_id,
                                    uint32_t *tensor, uint64_t *base_off);

  const CheckView v_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_CHECKS_H_
