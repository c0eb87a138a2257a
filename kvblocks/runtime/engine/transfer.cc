// SPDX-License-Identifier: Apache-2.0
// Pull/Push of blocks and batches: the checks in CANN's order and the plan (engine/checks.h), then
// the plan executed on the remote cache's path.
#include <algorithm>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "kvblocks/error.h"
#include "common/util.h"
#include "engine/async.h"
#include "engine/checks.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/layerwise.h"
#include "engine/late.h"
#include "engine/transfer.h"
#include "plan/plan.h"

namespace kvblocks {

// ------------------------------------------------------------------ blocks
Status Impl::PullBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Transfer t;
  const Status st = checks_->PullBlocks(&t, src, dst, src_blocks, dst_blocks, ext);
  return exec_->Tally(&t, st != LLM_SUCCESS ? st : exec_->Run(&t, true));
}

Status Impl::PushBlocks(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                        const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPushBlocks;
  const Status st = checks_->PushBlocks(&t, src, dst, src_blocks, dst_blocks, ext);
  return exec_->Tally(&t, st != LLM_SUCCESS ? st : exec_->Run(&t, false));
}

// ------------------------------------------------------------------ batches
Status Impl::PullCache(const CacheIndex &src, const Cache &dst, uint32_t batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPullCache;
  const Status st = checks_->PullCache(&t, src, dst, batch_index, size, ext);
  return exec_->Tally(&t, st != LLM_SUCCESS ? st : exec_->Run(&t, true));
}

Status Impl::PushCache(const Cache &src, const CacheIndex &dst, uint32_t src_batch_index, int64_t size,
                       const KvCacheExtParam &ext) {
  Transfer t;
  t.kind = metrics::kPushCache;
  const Status st = checks_->PushCache(&t, src, dst, src_batch_index, size, ext);
  return exec_->Tally(&t, st != LLM_SUCCESS ? st : exec_->Run(&t, false));
}

// ------------------------------------------------------------------ transfers
void TransferFree::operator()(Transfer *t) const { delete t; }

TransferPtr NewTransfer() { return TransferPtr(new Transfer); }

// ------------------------------------------------------------------ asynchronous, layer-wise
Status Impl::SubmitBlocks(const BlocksRequest *reqs, size_t n, TransferHandle *out, size_t *failed) {
  return async_->SubmitBlocks(reqs, n, out, failed);
}

Status Impl::SubmitOne(bool pull, const CacheIndex &remote, const Cache &local, const std::vector<uint64_t> &src_blocks,
                       const std::vector<uint64_t> &dst_blocks, const KvCacheExtParam &ext, TransferHandle *out) {
  return async_->SubmitOne(pull, remote, local, src_blocks, dst_blocks, ext, out);
}

Status Impl::OpenLayerPush(const Cache &src, const CacheIndex &dst, const std::vector<uint64_t> &src_blocks,
                           const std::vector<uint64_t> &dst_blocks, uint8_t tensor_num_per_layer, LayerPush *out) {
  return layerwise_->Open(src, dst, src_blocks, dst_blocks, tensor_num_per_layer, out);
}

Status Impl::OpenLayerPushPieces(const Cache &src, uint64_t dst_cluster_id, uint32_t num_layers,
                                 const std::vector<LayerPiece> &pieces, bool per_layer_deadline, LayerPush *out) {
  return layerwise_->OpenPieces(src, dst_cluster_id, num_layers, pieces, per_layer_deadline, out);
}

// ------------------------------------------------------------------ extensions
// By key: the link-time table, then caches learned since (engine/late.cc), then the peer is asked
// once (CACHE_QUERY by key). Not found is not remembered: a key bound later is found then.
Status Impl::FindRemoteCache(uint64_t cluster_id, int64_t key, int64_t *cache_id) {
  Transfer t;
  Status st;
  if ((st = checks_->FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
  for (const auto &kv : t.link->caches)
    if (kv.second.key == key) {
      *cache_id = kv.first;
      return LLM_SUCCESS;
    }
  {
    std::shared_lock<std::shared_mutex> g(t.link->late_mu);
    for (const auto &kv : t.link->late)
      if (key >= 0 && kv.second->key == key) {
        *cache_id = kv.first;
        return LLM_SUCCESS;
      }
  }
  std::shared_ptr<RemoteCache> rc;
  if ((st = late_->FindKey(t.link, kQueryByCacheKey, key, NowNs() + wait_time_ms_ * kMsNs, &rc)) != LLM_SUCCESS)
    return st;
  *cache_id = rc->id;
  return LLM_SUCCESS;
}

Status Impl::DescribeRemoteCache(uint64_t cluster_id, int64_t cache_id, RemoteCacheInfo *out) {
  Transfer t;
  Status st;
  if ((st = checks_->FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
  std::shared_ptr<RemoteCache> found;
  if ((st = late_->FindRemote(t.link, cache_id, NowNs() + wait_time_ms_ * kMsNs, &found)) != LLM_SUCCESS) return st;
  const RemoteCache &rc = *found;
  out->cache_id = rc.id;
  out->key = rc.key;
  out->num_tensors = rc.num_tensors;
  out->tensor_bytes = rc.tensor_bytes;
  out->num_blocks = rc.num_blocks;
  out->batch_size = rc.batch_size;
  out->stride = rc.stride;
  out->addrs = rc.addrs;
  out->allocated = rc.has_memfd;
  out->batch_keys = rc.batch_keys;
  std::shared_lock<std::shared_mutex> g(rc.live->mu);
  for (auto &k : out->batch_keys)
    if (rc.live->released_keys.count(k) != 0) k = -1;  // released since linking (keys.cc)
  return LLM_SUCCESS;
}

namespace {
// Where `rc` holds `key`: 1 and its batch index when a batch is bound to it (2 once this link saw
// it released), 3 when only the cache is tagged with it, 0 when neither.
int KeyIn(const RemoteCache &rc, int64_t key, uint32_t *batch_index) {
  for (size_t b = 0; b < rc.batch_keys.size(); ++b)
    if (rc.batch_keys[b] == key) {
      std::shared_lock<std::shared_mutex> g(rc.live->mu);
      if (rc.live->released_keys.count(key) != 0) return 2;  // released since it was described (keys.cc)
      *batch_index = static_cast<uint32_t>(b);
      return 1;
    }
  if (rc.key == key) {
    *batch_index = 0;
    return 3;
  }
  return 0;
}
}  // namespace

// A batch bound to `key` (else a cache tagged with it): the link-time table, then caches learned
// since, then the peer is asked once (CACHE_QUERY by batch key) and its answer searched the same way.
Status Impl::FindRemoteKey(uint64_t cluster_id, int64_t key, int64_t *cache_id, uint32_t *batch_index) {
  Transfer t;
  Status st;
  if ((st = checks_->FindLink(&t, cluster_id)) != LLM_SUCCESS) return st;
  if (key < 0)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache with key %lld", (unsigned long long)cluster_id,
                (long long)key);
  auto released = [&] {
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu released key %lld", (unsigned long long)cluster_id,
                (long long)key);
  };
  int64_t tagged = -1;  // a cache tagged with the key, when no batch is bound to it
  for (const auto &kv : t.link->caches) {
    const int where = KeyIn(kv.second, key, batch_index);
    if (where == 1) {
      *cache_id = kv.first;
      return LLM_SUCCESS;
    }
    if (where == 2) return released();
    if (where == 3 && tagged < 0) tagged = kv.first;
  }
  if (tagged < 0) {
    std::shared_lock<std::shared_mutex> g(t.link->late_mu);
    for (const auto &kv : t.link->late) {
      const int where = KeyIn(*kv.second, key, batch_index);
      if (where == 1) {
        *cache_id = kv.first;
        return LLM_SUCCESS;
      }
      if (where == 2) return released();
      if (where == 3 && tagged < 0) tagged = kv.first;
    }
  }
  if (tagged >= 0) {
    *cache_id = tagged;
    *batch_index = 0;
    return LLM_SUCCESS;
  }
  std::shared_ptr<RemoteCache> rc;
  if ((st = late_->FindKey(t.link, kQueryByBatchKey, key, NowNs() + wait_time_ms_ * kMsNs, &rc)) != LLM_SUCCESS)
    return st;
  const int where = KeyIn(*rc, key, batch_index);  // the answer holds it (engine/late.cc checked)
  if (where == 2) return released();
  *cache_id = rc->id;
  if (where != 1) *batch_index = 0;
  return LLM_SUCCESS;
}

Status Impl::PullRowToBlocks(const CacheIndex &src, const Cache &dst, const std::vector<uint64_t> &dst_blocks,
                             const KvCacheExtParam &ext) {
  Transfer t;
  const Status st = checks_->PullRowToBlocks(&t, src, dst, dst_blocks, ext);
  return exec_->Tally(&t, st != LLM_SUCCESS ? st : exec_->Run(&t, true));
}

std::string Impl::LinkPath(uint64_t cluster_id) {
  auto link = links_.FindAlive(cluster_id);
  return link ? link->PathName() : "";
}

std::shared_ptr<void> Impl::PinCacheMemory(int64_t cache_id) {
  auto e = caches_.Find(cache_id);
  return e ? std::shared_ptr<void>(e->region) : nullptr;
}

int Impl::LinkChannels(uint64_t cluster_id) {
  auto link = links_.Find(cluster_id);
  if (!link) return 0;
  std::lock_guard<std::mutex> g(link->mu);
  return static_cast<int>(link->fds.size());
}

}  // namespace kvblocks
