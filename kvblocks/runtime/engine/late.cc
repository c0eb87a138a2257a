// SPDX-License-Identifier: Apache-2.0
// Caches a peer registered after the link was made. CANN looks a remote cache up when a transfer
// names it; kvblocks exchanges cache tables at link time, so a cache id that table lacks is asked
// for once over the link's (authenticated) control connection: CACHE_QUERY, answered by one table
// entry or none in CACHE_INFO, decoded with the link-time table's checks. The entry is added to the
// link (Link::late) and reached over the served path, whose serving side checks every request against its own
// cache table: nothing the answer says is trusted for a one-sided copy. A link keeps at most
// kMaxLateCaches of them (Link::AddLate); transfers hold theirs by shared_ptr. Lookups by key
// (CANN's CacheKey, BlocksCacheKey) that neither table answers ask the same way by key (query kinds
// kQueryByBatchKey, kQueryByCacheKey; peers offering kCapKeyQuery only); the answer must hold the key.
#include "engine/late.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "link/link.h"
#include "transport/path.h"
#include "transport/registry.h"
#include "wire/messages.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {
constexpr uint32_t kLatePending = 0xFFFFFFFFU;
constexpr uint32_t kLateMalformed = 0xFFFFFFFEU;

// Whether an answer's entry holds what query (kind, what) asked for: the hostile-answer check of
// key queries (a by-id answer of another id is refused by its decoder already).
bool Holds(const TableEntry &e, int kind, int64_t what) {
  if (kind == kQueryById) return e.id == what;
  if (e.key == what) return true;
  return kind == kQueryByBatchKey && std::find(e.batch_keys.begin(), e.batch_keys.end(), what) != e.batch_keys.end();
}
}  // namespace

void LateCaches::Register(ControlChannel *control) {
  control->On(kCacheQuery, [this](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &p) {
    AnswerQuery(link.get(), p);
    return true;
  });
  control->On(kCacheInfo, [this](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &p) {
    OnInfo(link.get(), p);
    return true;
  });
}

Status LateCaches::FindRemote(const std::shared_ptr<Link> &link, int64_t cache_id, int64_t deadline,
                              std::shared_ptr<RemoteCache> *out) {
  const unsigned long long peer = link->remote_cluster_id;
  const long long id = static_cast<long long>(cache_id);
  if (cache_id <= 0) return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache %lld", peer, id);
  if ((*out = link->FindCache(cache_id)) != nullptr) return LLM_SUCCESS;
  if ((link->capabilities & kCapCacheQuery) == 0)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache %lld (as of linking; its kvblocks cannot be "
                "asked about caches registered later)", peer, id);
  return AskPeer(link, kQueryById, cache_id, deadline, out);
}

Status LateCaches::FindKey(const std::shared_ptr<Link> &link, uint8_t kind, int64_t key, int64_t deadline,
                           std::shared_ptr<RemoteCache> *out) {
  const unsigned long long peer = link->remote_cluster_id;
  if (key < 0) return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache with key %lld", peer, (long long)key);
  if ((link->capabilities & kCapKeyQuery) == 0)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache with key %lld (as of linking; its kvblocks cannot "
                "be asked about keys bound later)", peer, static_cast<long long>(key));
  return AskPeer(link, kind, key, deadline, out);
}

// Asks the peer once for (kind, what); callers for the same (kind, what) share the query. An answer
// of none, a malformed one, a timeout or a failed link is not remembered: the next call asks again.
Status LateCaches::AskPeer(const std::shared_ptr<Link> &link, uint8_t kind, int64_t what, int64_t deadline,
                           std::shared_ptr<RemoteCache> *out) {
  const unsigned long long peer = link->remote_cluster_id;
  const long long id = static_cast<long long>(what);
  const char *named = kind == kQueryById ? "cache" : "a cache with key";
  const std::pair<int, int64_t> slot(kind, what);
  std::unique_lock<std::mutex> g(link->mu);
  auto ins = link->late_queries.emplace(slot, Link::LateQuery{0, kLatePending, 0, nullptr});
  Link::LateQuery &q = ins.first->second;  // not erased while we wait on it (waiters > 0)
  ++q.waiters;
  if (ins.second) {
    // The first caller asks; later ones for the same id or key wait for the same answer.
    q.seq = ++link->late_seq;
    CacheQuery cq;
    cq.seq = q.seq;
    cq.kind = static_cast<CacheQueryKind>(kind);
    if (kind == kQueryById) cq.cache_id = what; else cq.key = what;
    std::string ref;
    Encode(cq, &ref);
    g.unlock();
    const bool sent = link->SendCtrl(kCacheQuery, deadline, ref);
    g.lock();
    if (!sent && q.status == kLatePending) q.status = LLM_LINK_FAILED;
  }
  while (q.status == kLatePending && link->alive.load()) {
    const int64_t left = deadline - NowNs();
    if (left <= 0) break;
    link->cv.wait_for(g, std::chrono::nanoseconds(left));
  }
  const uint32_t st = q.status;
  *out = q.entry;
  const bool alive = link->alive.load();
  if (--q.waiters == 0) link->late_queries.erase(slot);
  g.unlock();
  if (st == LLM_SUCCESS && *out != nullptr) return LLM_SUCCESS;
  if (st == kLatePending && alive)
    return Fail(LLM_TIMEOUT, "cluster %llu did not say within llm.SyncKvCacheWaitTime=%lld ms whether it has %s %lld",
                peer, static_cast<long long>(*d_.wait_ms), named, id);
  if (st == kLatePending || st == LLM_LINK_FAILED)
    return Fail(LLM_LINK_FAILED, "the link to cluster %llu failed while asking it for %s %lld", peer, named, id);
  if (st == kLateMalformed)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu answered a malformed description of %s %lld", peer, named, id);
  return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no %s %lld", peer, named, id);
}

// The peer asks for one of our caches. Answered with what the link-time table would say of it now,
// or with none for a cache that is unknown or being unregistered. The table lock is held while the
// entry is read (SetBatchKeys), not while it is sent: a peer that stops reading must not delay an
// unregister. An answer that crosses an unregister is harmless: the peer reaches the cache over the
// served path only, and we serve no request for a removed cache.
void LateCaches::AnswerQuery(Link *link, const std::string &payload) {
  CacheQuery q;
  if (!Decode(payload, &q)) return;  // malformed: nothing to answer
  CacheInfo info;
  info.cache_id = q.kind == kQueryById ? q.cache_id : 0;
  info.seq = q.seq;
  // No state_mu_: Finalize may hold it while it waits for this thread. The registry has its own lock.
  // Keys are read under table_mu_, the lock SetBatchKeys and key release write them under.
  std::shared_lock<std::shared_timed_mutex> table_hold(*d_.table_mu, std::defer_lock);
  if (d_.running()) {
    table_hold.lock();
    std::shared_ptr<CacheEntry> e;
    if (q.kind == kQueryById) {
      e = q.cache_id > 0 ? d_.caches->Find(q.cache_id) : nullptr;
    } else {
      // By batch key: a batch bound to the key first, then a cache tagged with it (as the asker's
      // FindRemoteKey searches its table); by cache key: a tagged cache. Lowest id first.
      d_.caches->Visit([&](const std::map<int64_t, std::shared_ptr<CacheEntry>> &all) {
        if (q.kind == kQueryByBatchKey)
          for (const auto &kv : all) {
            const auto &bk = kv.second->batch_keys;
            if (!kv.second->closing.load() && std::find(bk.begin(), bk.end(), q.key) != bk.end()) {
              e = kv.second;
              return;
            }
          }
        for (const auto &kv : all)
          if (!kv.second->closing.load() && kv.second->key == q.key) {
            e = kv.second;
            return;
          }
      });
    }
    if (e && !e->closing.load()) {
      info.found = true;
      info.cache_id = e->id;
      info.entry = e->Describe();
      std::unique_lock<std::shared_mutex> g(link->late_mu);
      if (link->late_shown.size() >= kMaxLateCaches)  // forget those since unregistered
        for (auto it = link->late_shown.begin(); it != link->late_shown.end();)
          it = d_.caches->Find(*it) ? std::next(it) : link->late_shown.erase(it);
      link->late_shown.insert(e->id);
    }
  }
  if (table_hold.owns_lock()) table_hold.unlock();
  std::string out;
  Encode(info, &out);
  link->SendCtrl(kCacheInfo, NowNs() + kSecNs, out);
}

// The peer's answer to our CACHE_QUERY. Only an answer someone is waiting for is taken; a malformed
// one fails every query in flight on the link (its id cannot be trusted), without touching the link.
void LateCaches::OnInfo(Link *link, const std::string &payload) {
  CacheInfo info;
  const bool ok = Decode(payload, &info);
  std::lock_guard<std::mutex> g(link->mu);
  if (!ok) {
    LogWarn("cluster %llu sent a malformed CACHE_INFO; refused", static_cast<unsigned long long>(link->remote_cluster_id));
    for (auto &kv : link->late_queries)
      if (kv.second.status == kLatePending) kv.second.status = kLateMalformed;
    link->cv.notify_all();
    return;
  }
  auto it = std::find_if(link->late_queries.begin(), link->late_queries.end(),
                         [&](const std::pair<const std::pair<int, int64_t>, Link::LateQuery> &kv) {
                           return kv.second.seq == info.seq;
                         });
  if (it == link->late_queries.end() || it->second.status != kLatePending) return;  // not asked (or no longer)
  const int kind = it->first.first;
  const int64_t what = it->first.second;
  if (!info.found) {
    it->second.status = LLM_KV_CACHE_NOT_EXIST;
  } else if (!Holds(info.entry, kind, what) || info.entry.id <= 0) {
    LogWarn("cluster %llu answered a query with cache %lld, which does not hold what was asked; refused",
            static_cast<unsigned long long>(link->remote_cluster_id), static_cast<long long>(info.entry.id));
    it->second.status = kLateMalformed;
  } else {
    // Only the served path reaches a late cache: its memfd was not exchanged, no attach data comes
    // for it, and no address learned on the control connection is used for a one-sided copy.
    auto rc = std::make_shared<RemoteCache>(std::move(info.entry));
    rc->path = ServedPath(link, *rc);
    // A cache of the link-time table whose key was bound after linking is reached through that
    // table (by id); only caches it lacks are kept.
    if (link->caches.count(info.cache_id) == 0) link->AddLate(rc);
    it->second.entry = std::move(rc);
    it->second.status = LLM_SUCCESS;
  }
  link->cv.notify_all();
}

}  // namespace kvblocks
