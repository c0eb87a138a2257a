// SPDX-License-Identifier: Apache-2.0
#include "link/registry.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

std::shared_ptr<Link> LinkRegistry::Find(uint64_t cluster_id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(cluster_id);
  return it == links_.end() ? nullptr : it->second;
}

std::shared_ptr<Link> LinkRegistry::FindAlive(uint64_t cluster_id) const {
  std::shared_ptr<Link> link = Find(cluster_id);
  if (link && !link->alive.load()) link.reset();
  return link;  // moved out, not copied: no extra reference count traffic per transfer
}

Status LinkRegistry::Insert(const std::shared_ptr<Link> &link, const std::atomic<bool> &stopping) {
  std::lock_guard<std::mutex> g(mu_);
  if (stopping.load()) return LLM_LINK_FAILED;
  auto it = links_.find(link->remote_cluster_id);
  if (it != links_.end()) {
    if (it->second->alive.load()) return LLM_ALREADY_LINK;
    it->second->Fail();
  }
  links_[link->remote_cluster_id] = link;
  link->registered.store(true);
  if (link->stats) link->stats->OnLinked();
  return LLM_SUCCESS;
}

void LinkRegistry::Erase(const std::shared_ptr<Link> &link) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(link->remote_cluster_id);
  if (it != links_.end() && it->second == link) links_.erase(it);
}

std::map<uint64_t, std::shared_ptr<Link>> LinkRegistry::TakeAll() {
  std::lock_guard<std::mutex> g(mu_);
  std::map<uint64_t, std::shared_ptr<Link>> all;
  all.swap(links_);
  return all;
}

std::vector<std::shared_ptr<Link>> LinkRegistry::SameHostAlive() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::shared_ptr<Link>> out;
  for (const auto &kv : links_)
    if (kv.second->alive.load() && OneSidedPeer(*kv.second)) out.push_back(kv.second);
  return out;
}

std::vector<std::shared_ptr<Link>> LinkRegistry::Alive() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::shared_ptr<Link>> out;
  for (const auto &kv : links_)
    if (kv.second->alive.load()) out.push_back(kv.second);
  return out;
}

void LinkRegistry::CountAlive(const std::string &addr, size_t *from_addr, size_t *total) const {
  std::lock_guard<std::mutex> g(mu_);
  *from_addr = *total = 0;
  for (const auto &kv : links_) {
    if (!kv.second->alive.load()) continue;
    ++*total;
    *from_addr += kv.second->peer_addr == addr;
  }
}

bool LinkRegistry::empty() const {
  std::lock_guard<std::mutex> g(mu_);
  return links_.empty();
}

void LinkRegistry::ShutdownAll() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto &kv : links_) {
    kv.second->alive.store(false);
    kv.second->Shutdown();
  }
}

}  // namespace kvblocks
