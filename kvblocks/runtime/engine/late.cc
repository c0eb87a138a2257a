// SPDX-License-Identifier: Apache-2.0
// Caches a peer registered after the link was made. CANN looks a remote cache up when a transfer
// names it; kvblocks exchanges cache tables at link time, so a cache id that table lacks is asked
// for once over the link's (authenticated) control connection: CACHE_QUERY, answered by one table
// entry or none in CACHE_INFO, decoded with the link-time table's checks. The entry is added to the
// link (Link::late) and reached over TCP, whose serving side checks every request against its own
// cache table: nothing the answer says is trusted for a one-sided copy. A link keeps at most
// kMaxLateCaches of them (Link::AddLate); transfers hold theirs by shared_ptr.
#include "common/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "link/link.h"
#include "transport/path.h"
#include "wire/messages.h"

namespace kvblocks {

namespace {
constexpr uint32_t kLatePending = 0xFFFFFFFFU;
constexpr uint32_t kLateMalformed = 0xFFFFFFFEU;
}  // namespace

Status Impl::FindLateRemote(const std::shared_ptr<struct Link> &link, int64_t cache_id, int64_t deadline,
                            std::shared_ptr<RemoteCache> *out) {
  const unsigned long long peer = link->remote_cluster_id;
  const long long id = static_cast<long long>(cache_id);
  if (cache_id <= 0) return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache %lld", peer, id);
  if ((*out = link->FindCache(cache_id)) != nullptr) return LLM_SUCCESS;
  if ((link->capabilities & kCapCacheQuery) == 0)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache %lld (as of linking; its kvblocks cannot be "
                "asked about caches registered later)", peer, id);
  std::unique_lock<std::mutex> g(link->mu);
  auto ins = link->late_queries.emplace(cache_id, Link::LateQuery{0, kLatePending, 0, nullptr});
  Link::LateQuery &q = ins.first->second;  // not erased while we wait on it (waiters > 0)
  ++q.waiters;
  if (ins.second) {
    // The first caller asks; later ones for the same id wait for the same answer.
    q.seq = ++link->late_seq;
    std::string ref;
    Encode(CacheQuery{cache_id, q.seq}, &ref);
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
  if (--q.waiters == 0) link->late_queries.erase(cache_id);
  g.unlock();
  if (st == LLM_SUCCESS && *out != nullptr) return LLM_SUCCESS;
  if (st == kLatePending && alive)
    return Fail(LLM_TIMEOUT, "cluster %llu did not say within llm.SyncKvCacheWaitTime=%lld ms whether it has cache %lld",
                peer, static_cast<long long>(wait_time_ms_), id);
  if (st == kLatePending || st == LLM_LINK_FAILED)
    return Fail(LLM_LINK_FAILED, "the link to cluster %llu failed while asking it for cache %lld", peer, id);
  if (st == kLateMalformed)
    return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu answered a malformed description of cache %lld", peer, id);
  return Fail(LLM_KV_CACHE_NOT_EXIST, "cluster %llu has no cache %lld", peer, id);
}

// The peer asks for one of our caches. Answered with what the link-time table would say of it now,
// or with none for a cache that is unknown or being unregistered. The table lock is held while the
// entry is read (SetBatchKeys), not while it is sent: a peer that stops reading must not delay an
// unregister. An answer that crosses an unregister is harmless: the peer reaches the cache over TCP
// only, and we serve no request for a removed cache.
void Impl::AnswerCacheQuery(struct Link *link, const std::string &payload) {
  CacheQuery q;
  if (!Decode(payload, &q)) return;  // malformed: nothing to answer
  const int64_t cache_id = q.cache_id;
  CacheInfo info;
  info.cache_id = cache_id;
  info.seq = q.seq;
  // No state_mu_: Finalize may hold it while it waits for this thread. The registry has its own lock.
  std::shared_lock<std::shared_timed_mutex> table_hold(table_mu_, std::defer_lock);
  if (initialized()) {
    table_hold.lock();
    auto e = cache_id > 0 ? caches_.Find(cache_id) : nullptr;
    if (e && !e->closing.load()) {
      info.found = true;
      info.entry = e->Describe();
      std::unique_lock<std::shared_mutex> g(link->late_mu);
      if (link->late_shown.size() >= kMaxLateCaches)  // forget those since unregistered
        for (auto it = link->late_shown.begin(); it != link->late_shown.end();)
          it = caches_.Find(*it) ? std::next(it) : link->late_shown.erase(it);
      link->late_shown.insert(cache_id);
    }
  }
  if (table_hold.owns_lock()) table_hold.unlock();
  std::string out;
  Encode(info, &out);
  link->SendCtrl(kCacheInfo, NowNs() + kSecNs, out);
}

// The peer's answer to our CACHE_QUERY. Only an answer someone is waiting for is taken; a malformed
// one fails every query in flight on the link (its id cannot be trusted), without touching the link.
void Impl::OnCacheInfo(struct Link *link, const std::string &payload) {
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
  auto it = link->late_queries.find(info.cache_id);
  if (it == link->late_queries.end() || it->second.seq != info.seq || it->second.status != kLatePending)
    return;  // not asked (or no longer)
  if (!info.found) {
    it->second.status = LLM_KV_CACHE_NOT_EXIST;
  } else {
    // Only TCP reaches a late cache: its memfd was not exchanged, and no address or rkey learned on
    // the control connection is used for a one-sided copy.
    TableEntry &e = info.entry;
    e.ucx_worker.clear();
    e.ucx_rkeys.clear();
    e.ucx_key_of.clear();
    auto rc = std::make_shared<RemoteCache>(std::move(e));
    rc->path = MakeTcpPath(link, info.cache_id);
    link->AddLate(rc);
    it->second.entry = std::move(rc);
    it->second.status = LLM_SUCCESS;
  }
  link->cv.notify_all();
}

}  // namespace kvblocks
