// SPDX-License-Identifier: Apache-2.0
// What a transfer holds while its bytes move: checks.cc fills it, executor.cc runs it (ranges.cc,
// async.cc and layerwise.cc hold them too).
// No engine header: a part that only prepares or runs transfers does not rebuild with engine.h.
#ifndef KVBLOCKS_RUNTIME_ENGINE_TRANSFER_H_
#define KVBLOCKS_RUNTIME_ENGINE_TRANSFER_H_

#include <memory>
#include <shared_mutex>
#include <vector>

#include "cache/cache.h"
#include "link/link.h"
#include "metrics/stats.h"
#include "plan/plan.h"

namespace kvblocks {

struct Transfer;
// Frees a Transfer (defined in transfer.cc) on the thread that holds its locks.
struct TransferFree {
  void operator()(Transfer *t) const;
};
using TransferPtr = std::unique_ptr<Transfer, TransferFree>;
TransferPtr NewTransfer();  // transfer.cc

struct Transfer {
  std::shared_lock<std::shared_mutex> state;
  int64_t deadline = 0;
  int64_t start_ns = 0;  // the call (or submission): where its latency counts from
  metrics::Kind kind = metrics::kPullBlocks;
  std::shared_ptr<CacheEntry> local;
  std::shared_ptr<struct Link> link;
  const RemoteCache *remote = nullptr;
  std::shared_ptr<const RemoteCache> remote_hold;  // a cache learned after linking: held while in use
  std::unique_ptr<RemoteUse> remote_use;
  std::unique_ptr<CacheUse> local_use;  // a pipelined transfer's (Impl::StartPiped)
  Plan plan;
  // Address-based transfers (ranges.cc) touch several (local, remote) cache pairs: one plan each.
  // They run after this one, in order, on the same link and deadline; they hold no engine lock.
  std::vector<TransferPtr> rest;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_TRANSFER_H_
