// SPDX-License-Identifier: Apache-2.0
// CANN's key release (spec hixl.md 3.4), kept by the cache's owner: a puller that consumed a key
// says so (KEY_CONSUMED); the owner unbinds it, tells its other peers (KEY_RELEASED), and frees a
// cache whose deallocate waited for its last bound key. The engine owns one; its frames are in the
// engine's ControlChannel table.
#ifndef KVBLOCKS_RUNTIME_ENGINE_KEYS_H_
#define KVBLOCKS_RUNTIME_ENGINE_KEYS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>

#include "cache/cache.h"
#include "link/control.h"
#include "link/registry.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

class KeyRelease {
 public:
  // What it shares with the engine that owns it.
  struct Deps {
    CacheRegistry *caches;
    LinkRegistry *links;
    std::shared_timed_mutex *table_mu;  // batch keys are written under it (handshakes read them)
    std::shared_mutex *state_mu;        // the engine's API lock: taken shared, never waited for
    std::function<bool()> running;      // initialized and not finalized
    std::function<bool(std::function<void()>)> spawn;       // a runtime thread; false when none
    std::function<llm_datadist::Status(int64_t)> remove;    // unregisters a cache (state_mu held shared)
  };
  explicit KeyRelease(Deps d) : d_(std::move(d)) {}
  void Register(ControlChannel *control);  // KEY_CONSUMED and KEY_RELEASED; before any link runs

  // The calls below run with the engine's API lock held shared and the engine initialized.
  // Deallocate `cache_id` now, or (*deferred) once its last bound key is released.
  llm_datadist::Status DeallocateWhenUnbound(int64_t cache_id, bool *deferred);
  // Unbinds `key` of our cache (LLM_KV_CACHE_NOT_EXIST: no such cache) and tells our peers.
  llm_datadist::Status UnbindKey(int64_t cache_id, int64_t key, bool *was_bound);
  // The puller's side: `key` of the peer's cache is gone here at once, and the owner is told
  // (LLM_NOT_YET_LINK, LLM_KV_CACHE_NOT_EXIST, LLM_LINK_FAILED).
  llm_datadist::Status ReleaseRemoteKey(uint64_t cluster_id, int64_t cache_id, int64_t key);

 private:
  bool UnbindHeld(CacheEntry *e, int64_t key, bool *free_now);
  void AnnounceReleased(int64_t cache_id, int64_t key);
  void FreeUnbound(int64_t cache_id);
  void OnKeyConsumed(const std::shared_ptr<Link> &link, const std::string &payload);
  void OnKeyReleased(Link *link, const std::string &payload);

  Deps d_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_KEYS_H_
