// SPDX-License-Identifier: Apache-2.0
// kvblocks extensions beyond CANN's API: cache kinds and keys for the Python compatibility layer,
// and link introspection. Not available when building against a real CANN install.
#ifndef KVBLOCKS_EXT_H_
#define KVBLOCKS_EXT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvblocks/async.h"
#include "kvblocks/error.h"
#include "kvblocks/ext_types.h"
#include "kvblocks/layerwise.h"
#include "kvblocks/layout.h"
#include "kvblocks/log.h"
#include "kvblocks/metrics.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct KVBLOCKS_API ImplAccess {
  // Registers (addrs non-empty) or allocates (addrs empty) a cache of the given kind;
  // `key` >= 0 tags it for lookup by peers (CANN's BlocksCacheKey.model_id).
  static llm_datadist::Status AddCache(llm_datadist::LlmDataDist &dd, const llm_datadist::CacheDesc &desc,
                                       const std::vector<uint64_t> &addrs, CacheKind kind, int64_t key,
                                       llm_datadist::Cache &out);
  // Cache id of the peer's cache tagged `key` (from the link-time table), or LLM_KV_CACHE_NOT_EXIST.
  static llm_datadist::Status FindRemoteCache(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t key,
                                              int64_t &cache_id);
  // The peer's cache `cache_id` (from the link-time table), or LLM_NOT_YET_LINK / LLM_KV_CACHE_NOT_EXIST.
  static llm_datadist::Status DescribeRemoteCache(llm_datadist::LlmDataDist &dd, uint64_t cluster_id,
                                                  int64_t cache_id, RemoteCacheInfo &out);
  // Path used towards a linked peer: "inprocess", "shm", "cma", "tcp" or "" when not linked.
  static std::string LinkPath(llm_datadist::LlmDataDist &dd, uint64_t cluster_id) noexcept;
  // Keeps the memory of an allocated cache mapped while the returned handle lives (null for
  // registered memory, which the caller owns).
  static std::shared_ptr<void> PinCacheMemory(llm_datadist::LlmDataDist &dd, int64_t cache_id) noexcept;
  // Binds keys[i] to batch index i of a local cache (-1 leaves an index unbound); peers see them in
  // the cache table from their next link on. LLM_PARAM_INVALID for more keys than batch rows.
  static llm_datadist::Status SetBatchKeys(llm_datadist::LlmDataDist &dd, int64_t cache_id,
                                           const std::vector<int64_t> &keys) noexcept;
  // The peer's cache and batch index bound to `key` (batch keys first, then a cache's own key at
  // batch 0), or LLM_NOT_YET_LINK / LLM_KV_CACHE_NOT_EXIST.
  static llm_datadist::Status FindRemoteKey(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t key,
                                            int64_t &cache_id, uint32_t &batch_index) noexcept;
  // CANN's key release (spec hixl.md 3.4), kept by the owner. DeallocateWhenUnbound frees an
  // allocated cache now, or (`deferred` true) once no batch key is bound any more; registered
  // caches are removed at once. UnbindKey unbinds `key` from a local cache (`was_bound` says
  // whether it was), telling linked peers, and frees a deferred cache with its last key.
  // ReleaseRemoteKey: this engine consumed `key` of the peer's cache `cache_id`; pulls by it fail
  // here from now on and the owner is told, which unbinds it (LLM_NOT_YET_LINK, LLM_KV_CACHE_NOT_EXIST).
  static llm_datadist::Status DeallocateWhenUnbound(llm_datadist::LlmDataDist &dd, int64_t cache_id,
                                                    bool &deferred) noexcept;
  static llm_datadist::Status UnbindKey(llm_datadist::LlmDataDist &dd, int64_t cache_id, int64_t key,
                                        bool &was_bound) noexcept;
  static llm_datadist::Status ReleaseRemoteKey(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, int64_t cache_id,
                                               int64_t key) noexcept;
  // CANN's pull_blocks from a contiguous cache: batch row src.batch_index of the peer's cache is
  // cut into local-block-sized chunks and chunk j lands in dst_blocks[j] (the last may be short),
  // in every selected tensor. Checked as PullKvBlocks, before any byte moves.
  static llm_datadist::Status PullRowToBlocks(llm_datadist::LlmDataDist &dd, const llm_datadist::CacheIndex &src,
                                              const llm_datadist::Cache &dst, const std::vector<uint64_t> &dst_blocks,
                                              const llm_datadist::KvCacheExtParam &ext) noexcept;
  // True while this engine has a link (made or accepted) to any peer.
  static bool HasLinks(llm_datadist::LlmDataDist &dd) noexcept;
  // Number of data channels currently open towards a peer (tests and introspection).
  static int LinkChannels(llm_datadist::LlmDataDist &dd, uint64_t cluster_id) noexcept;
  // Why the last LinkLlmClusters (or hixl Connect) to `cluster_id` failed: its reason, status and
  // message. False when that attempt succeeded or none was made. Kept until the next attempt.
  static bool LastLinkFailure(llm_datadist::LlmDataDist &dd, uint64_t cluster_id, LinkFailure &out) noexcept;
  // "refused", "unreachable", "timed_out", "auth_refused", "wrong_cluster_id", "version_mismatch",
  // "limit_exceeded", "already_linked", "other" (or "none").
  static const char *LinkFailureReasonName(LinkFailureReason reason) noexcept;
  // The address the listener is bound to ("ip:port" or "[ip6]:port"), with the port the kernel
  // chose when llm.ListenIpInfo gave port 0; "" when this engine does not listen.
  static std::string ListenAddress(llm_datadist::LlmDataDist &dd) noexcept;
  // This engine's counters now (include/kvblocks/metrics.h), and the same as one JSON object.
  static EngineMetrics Metrics(llm_datadist::LlmDataDist &dd) noexcept;
  static std::string MetricsJson(llm_datadist::LlmDataDist &dd) noexcept;

  // Asynchronous PullKvBlocks / PushKvBlocks (include/kvblocks/async.h). Every check of the
  // synchronous call runs here, with its statuses; on LLM_SUCCESS `out` is the in-flight transfer,
  // whose deadline (llm.SyncKvCacheWaitTime) counts from this call. On a failure nothing moves.
  static llm_datadist::Status PullKvBlocksAsync(llm_datadist::LlmDataDist &dd,
                                                const llm_datadist::CacheIndex &src_cache_index,
                                                const llm_datadist::Cache &dst_cache,
                                                const std::vector<uint64_t> &src_blocks,
                                                const std::vector<uint64_t> &dst_blocks,
                                                const llm_datadist::KvCacheExtParam &ext_param,
                                                TransferHandle &out) noexcept;
  static llm_datadist::Status PushKvBlocksAsync(llm_datadist::LlmDataDist &dd, const llm_datadist::Cache &src_cache,
                                                const llm_datadist::CacheIndex &dst_cache_index,
                                                const std::vector<uint64_t> &src_blocks,
                                                const std::vector<uint64_t> &dst_blocks,
                                                const llm_datadist::KvCacheExtParam &ext_param,
                                                TransferHandle &out) noexcept;
  // Submits every request, or none: all are checked first; the first failure is returned with
  // `failed` set to its index (and its reason as the last error), and nothing is submitted. On
  // LLM_SUCCESS `out` holds one handle per request, in order.
  static llm_datadist::Status SubmitBlocksBatch(llm_datadist::LlmDataDist &dd,
                                                const std::vector<BlocksRequest> &requests,
                                                std::vector<TransferHandle> &out, size_t &failed) noexcept;

  // Sends a notification (name and message at most 1024 bytes each) to a linked peer and waits up
  // to `timeout_ms` for it to be queued there. It is delivered after every transfer on that link
  // that returned (or whose handle completed) before this call. LLM_PARAM_INVALID: too long or
  // timeout <= 0; LLM_NOT_YET_LINK: no link; LLM_LINK_BUSY: the peer holds 4096 undelivered
  // notifications (nothing was queued; retry later); LLM_TIMEOUT: no answer in time.
  static llm_datadist::Status SendNotify(llm_datadist::LlmDataDist &dd, uint64_t cluster_id,
                                         const std::string &name, const std::string &message,
                                         int32_t timeout_ms) noexcept;
  // Takes every notification received so far, in arrival order.
  static llm_datadist::Status GetNotifies(llm_datadist::LlmDataDist &dd, std::vector<NotifyMessage> &out) noexcept;
  // Layer-wise push (include/kvblocks/layerwise.h): the arguments of PushKvBlocks without the layer
  // ranges; every layer (num_tensors / tensor_num_per_layer of them) goes to the same remote layer.
  // Every check of PushKvBlocks runs here, with its statuses; on LLM_SUCCESS `out` is open and its
  // deadline (llm.SyncKvCacheWaitTime) runs from this call. On a failure nothing moves.
  static llm_datadist::Status OpenLayerPush(llm_datadist::LlmDataDist &dd, const llm_datadist::Cache &src_cache,
                                            const llm_datadist::CacheIndex &dst_cache_index,
                                            const std::vector<uint64_t> &src_blocks,
                                            const std::vector<uint64_t> &dst_blocks, uint8_t tensor_num_per_layer,
                                            LayerPush &out) noexcept;
  // A layer-wise push of arbitrary pieces to one peer (CANN's transfer_cache_async). Each piece is
  // checked against both cache tables here. per_layer_deadline: each layer's deadline runs from its
  // LayerReady call (CANN's per-layer TransferCache) instead of from the open.
  static llm_datadist::Status OpenLayerPushPieces(llm_datadist::LlmDataDist &dd, const llm_datadist::Cache &src_cache,
                                                  uint64_t dst_cluster_id, uint32_t num_layers,
                                                  const std::vector<LayerPiece> &pieces, bool per_layer_deadline,
                                                  LayerPush &out) noexcept;

  // Prepared transfers and layout transforms (include/kvblocks/layout.h). Every check of
  // PullKvBlocks / PushKvBlocks (request.pull) runs here, with its statuses; `layout` (may be null)
  // replaces equal block sizes and list lengths by its own rules. On LLM_SUCCESS `out` holds the plan.
  static llm_datadist::Status PrepareBlocksTransfer(llm_datadist::LlmDataDist &dd, const BlocksRequest &request,
                                                    const LayoutTransform *layout, PreparedTransfer &out) noexcept;
  // Runs a prepared transfer as the synchronous call would (deadline llm.SyncKvCacheWaitTime from
  // now), after checking that the caches and link it names are still there and still fit.
  static llm_datadist::Status ExecutePrepared(llm_datadist::LlmDataDist &dd, const PreparedTransfer &p) noexcept;
  static llm_datadist::Status ExecutePreparedAsync(llm_datadist::LlmDataDist &dd, const PreparedTransfer &p,
                                                   TransferHandle &out) noexcept;
  static PreparedInfo DescribePrepared(const PreparedTransfer &p) noexcept;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_EXT_H_
