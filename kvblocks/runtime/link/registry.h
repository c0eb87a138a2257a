// SPDX-License-Identifier: Apache-2.0
// This engine's links, one per remote cluster id.
#ifndef KVBLOCKS_RUNTIME_LINK_REGISTRY_H_
#define KVBLOCKS_RUNTIME_LINK_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "link/link.h"

namespace kvblocks {

class LinkRegistry {
 public:
  std::shared_ptr<Link> Find(uint64_t cluster_id) const;
  std::shared_ptr<Link> FindAlive(uint64_t cluster_id) const;
  // Registers `link`; a dead link to the same cluster (a restarted peer) is replaced.
  // LLM_ALREADY_LINK when a live one exists, LLM_LINK_FAILED once `stopping` is set.
  llm_datadist::Status Insert(const std::shared_ptr<Link> &link, const std::atomic<bool> &stopping);
  void Erase(const std::shared_ptr<Link> &link);  // only while it is the registered one
  std::map<uint64_t, std::shared_ptr<Link>> TakeAll();
  std::vector<std::shared_ptr<Link>> SameHostAlive() const;
  std::vector<std::shared_ptr<Link>> Alive() const;
  bool empty() const;
  // Live links in all, and those whose peer_addr is `addr`.
  void CountAlive(const std::string &addr, size_t *from_addr, size_t *total) const;
  void ShutdownAll();  // marks every link dead and wakes its I/O

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Link>> links_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_REGISTRY_H_
