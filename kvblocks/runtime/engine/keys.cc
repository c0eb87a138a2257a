// SPDX-License-Identifier: Apache-2.0
// CANN's key release (spec hixl.md 3.4), kept by the cache's owner: a puller that consumed a key
// says so (KEY_CONSUMED); the owner unbinds it, tells its other peers (KEY_RELEASED), and frees a
// cache whose deallocate waited for its last bound key.
#include <algorithm>

#include "common/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "engine/keys.h"
#include "wire/messages.h"

namespace kvblocks {

namespace {
bool AnyBound(const std::vector<int64_t> &keys) {
  return std::any_of(keys.begin(), keys.end(), [](int64_t k) { return k >= 0; });
}
}  // namespace

// Unbinds `key` from its batch of `e`; true when it was bound. `*free_now`: the deferred
// deallocate of `e` is due (reported once).
bool KeyRelease::UnbindHeld(CacheEntry *e, int64_t key, bool *free_now) {
  *free_now = false;
  if (key < 0) return false;
  std::unique_lock<std::shared_timed_mutex> hold(*d_.table_mu);  // no handshake is reading the entry
  auto it = std::find(e->batch_keys.begin(), e->batch_keys.end(), key);
  if (it == e->batch_keys.end()) return false;
  *it = -1;
  if (e->free_when_unbound && !AnyBound(e->batch_keys)) {
    e->free_when_unbound = false;
    *free_now = true;
  }
  return true;
}

// Peers linked before the release still hold the key in their table: tell them.
void KeyRelease::AnnounceReleased(int64_t cache_id, int64_t key) {
  std::string payload;
  Encode(KeyRef{cache_id, key}, &payload);
  for (auto &l : d_.links->Alive()) l->SendCtrl(kKeyReleased, NowNs() + kSecNs, payload);
}

// Frees a cache whose deallocate was deferred. Runs on its own thread: the unregister waits for
// CACHE_GONE_ACKs, which control loops (the caller's among them) must read.
void KeyRelease::FreeUnbound(int64_t cache_id) {
  const bool started = d_.spawn([this, cache_id] {
    std::shared_lock<std::shared_mutex> lk(*d_.state_mu, std::try_to_lock);
    if (!lk.owns_lock() || !d_.running()) return;  // finalizing: every cache goes anyway
    if (d_.remove(cache_id) != LLM_SUCCESS)
      LogWarn("deferred deallocate of cache %lld failed; it stays allocated", static_cast<long long>(cache_id));
  });
  if (!started) LogWarn("no thread to free cache %lld; it stays allocated", static_cast<long long>(cache_id));
}

Status Impl::DeallocateWhenUnbound(int64_t cache_id, bool *deferred) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  return keys_->DeallocateWhenUnbound(cache_id, deferred);
}

Status Impl::UnbindKey(int64_t cache_id, int64_t key, bool *was_bound) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  return keys_->UnbindKey(cache_id, key, was_bound);
}

Status Impl::ReleaseRemoteKey(uint64_t cluster_id, int64_t cache_id, int64_t key) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  return keys_->ReleaseRemoteKey(cluster_id, cache_id, key);
}

void KeyRelease::Register(ControlChannel *control) {
  control->On(kKeyConsumed, [this](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &p) {
    OnKeyConsumed(link, p);
    return true;
  });
  control->On(kKeyReleased, [this](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &p) {
    OnKeyReleased(link.get(), p);
    return true;
  });
}

Status KeyRelease::DeallocateWhenUnbound(int64_t cache_id, bool *deferred) {
  *deferred = false;
  auto e = d_.caches->Find(cache_id);
  if (e && e->region) {  // registered memory is never freed by llm_datadist: removed at once
    std::unique_lock<std::shared_timed_mutex> hold(*d_.table_mu);
    if (AnyBound(e->batch_keys)) e->free_when_unbound = *deferred = true;
  }
  return *deferred ? LLM_SUCCESS : d_.remove(cache_id);
}

Status KeyRelease::UnbindKey(int64_t cache_id, int64_t key, bool *was_bound) {
  *was_bound = false;
  auto e = d_.caches->Find(cache_id);
  if (!e) return Fail(LLM_KV_CACHE_NOT_EXIST, "local cache %lld does not exist", static_cast<long long>(cache_id));
  bool free_now = false;
  *was_bound = UnbindHeld(e.get(), key, &free_now);
  if (*was_bound) AnnounceReleased(cache_id, key);
  return free_now ? d_.remove(cache_id) : LLM_SUCCESS;
}

// The puller's side: the key is gone for this engine at once, and the owner is told.
Status KeyRelease::ReleaseRemoteKey(uint64_t cluster_id, int64_t cache_id, int64_t key) {
  auto link = d_.links->FindAlive(cluster_id);
  if (!link) return Fail(LLM_NOT_YET_LINK, "not linked to cluster %llu", static_cast<unsigned long long>(cluster_id));
  std::shared_ptr<RemoteCache> rc = link->FindCache(cache_id);  // link-time, or learned since (engine/late.cc)
  if (rc == nullptr || key < 0)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache %lld known to this link",
                static_cast<unsigned long long>(cluster_id), static_cast<long long>(cache_id));
  {
    std::unique_lock<std::shared_mutex> g(rc->live->mu);
    rc->live->released_keys.insert(key);
  }
  std::string payload;
  Encode(KeyRef{cache_id, key}, &payload);
  if (!link->SendCtrl(kKeyConsumed, NowNs() + kSecNs, payload))
    return Fail(LLM_LINK_FAILED, "cluster %llu: the control connection is closed", (unsigned long long)cluster_id);
  return LLM_SUCCESS;
}

// A peer says it consumed `key` of our cache. Trusted only as far as it goes: the cache must be
// ours, allocated, in the table that peer got, and the key bound to one of its batches; so a peer
// can at most release keys of caches it could pull anyway.
void KeyRelease::OnKeyConsumed(const std::shared_ptr<Link> &link, const std::string &payload) {
  KeyRef ref;
  if (!Decode(payload, &ref) || !link->Shown(ref.cache_id)) return;
  std::shared_lock<std::shared_mutex> lk(*d_.state_mu, std::try_to_lock);
  if (!lk.owns_lock() || !d_.running()) return;
  auto e = d_.caches->Find(ref.cache_id);
  if (!e || !e->region || e->closing.load()) return;
  bool free_now = false;
  if (!UnbindHeld(e.get(), ref.key, &free_now)) return;
  AnnounceReleased(ref.cache_id, ref.key);
  if (free_now) FreeUnbound(ref.cache_id);
}

// The owner released a key of its cache: pulls by it through this link fail from now on.
void KeyRelease::OnKeyReleased(Link *link, const std::string &payload) {
  KeyRef ref;
  if (!Decode(payload, &ref)) return;
  std::shared_ptr<RemoteCache> rc = link->FindCache(ref.cache_id);
  if (rc == nullptr) return;
  const auto &bk = rc->batch_keys;
  if (std::find(bk.begin(), bk.end(), ref.key) == bk.end()) return;  // only keys it showed us
  std::unique_lock<std::shared_mutex> g(rc->live->mu);
  rc->live->released_keys.insert(ref.key);
}

}  // namespace kvblocks
