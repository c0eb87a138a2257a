// SPDX-License-Identifier: Apache-2.0
// Caches a peer registered after the link was made, asked for once over the link's control
// connection (CACHE_QUERY / CACHE_INFO; engine/late.cc says why and how), and the answers we give
// the peer's own queries. The engine owns one; its frames are in the engine's ControlChannel table.
#ifndef KVBLOCKS_RUNTIME_ENGINE_LATE_H_
#define KVBLOCKS_RUNTIME_ENGINE_LATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>

#include "cache/cache.h"
#include "link/control.h"
#include "link/link.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

class LateCaches {
 public:
  // What it shares with the engine that owns it.
  struct Deps {
    CacheRegistry *caches;              // what we answer from
    std::shared_timed_mutex *table_mu;  // batch keys are written under it
    std::function<bool()> running;      // initialized and not finalized
    const int64_t *wait_ms;             // llm.SyncKvCacheWaitTime, named in a timeout's reason
  };
  explicit LateCaches(Deps d) : d_(std::move(d)) {}
  void Register(ControlChannel *control);  // CACHE_QUERY and CACHE_INFO; before any link runs

  // The peer's cache `cache_id`: from the link-time table, a late one known already, or asked
  // for once (peers offering kCapCacheQuery). LLM_KV_CACHE_NOT_EXIST, LLM_TIMEOUT, LLM_LINK_FAILED.
  llm_datadist::Status FindRemote(const std::shared_ptr<Link> &link, int64_t cache_id, int64_t deadline,
                                  std::shared_ptr<RemoteCache> *out);
  // The same for a key (kQueryByCacheKey / kQueryByBatchKey) neither table has: asks peers offering
  // kCapKeyQuery; *out is the answer's entry (for a link-time cache, a copy: reach it by id).
  llm_datadist::Status FindKey(const std::shared_ptr<Link> &link, uint8_t kind, int64_t key, int64_t deadline,
                               std::shared_ptr<RemoteCache> *out);

 private:
  llm_datadist::Status AskPeer(const std::shared_ptr<Link> &link, uint8_t kind, int64_t what, int64_t deadline,
                               std::shared_ptr<RemoteCache> *out);
  void AnswerQuery(Link *link, const std::string &payload);
  void OnInfo(Link *link, const std::string &payload);

  Deps d_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_LATE_H_
