// SPDX-License-Identifier: Apache-2.0
// The transport interface: a Path moves a Plan's bytes between one local cache and one remote
// cache before a deadline. Backends make them (transport/backend.h); one is chosen per remote cache
// at link time (transport/registry.h).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_PATH_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_PATH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "transport/memory.h"
#include "llm_datadist/llm_datadist.h"
#include "transport/plan.h"

namespace kvblocks {

struct PeerLink;
class Path;
class Backend;

// What a path is, so callers decide by type and never by name.
enum class PathMode : uint8_t {
  kLocalCopy,  // this thread copies the bytes itself (memcpy, process_vm_*): no peer, no network
  kRemoteDma,  // one-sided over a network (RDMA get/put): the peer's CPU takes no part
  kServed,     // requests the peer serves from its own table
};

// One transfer of a pipelined run (Path::ExecutePipelined): the arguments of Path::Execute.
struct PipeItem {
  const Plan *plan = nullptr;
  const LocalMemory *local = nullptr;
  Path *path = nullptr;  // returned the run's PipelineKey for this plan
  bool pull = true;
  int64_t deadline = 0;
  void *tag = nullptr;  // the feed's
};

// Where a pipelined run takes its transfers from and reports each one's end.
class PipeFeed {
 public:
  virtual ~PipeFeed() = default;
  // Another transfer for the run, if one is waiting; never blocks. The first call gives the first.
  virtual bool Next(PipeItem *item) = 0;
  // `item` ended with `st` (its reason in LastErrorMessage()); no byte of it moves afterwards.
  virtual void Done(const PipeItem &item, llm_datadist::Status st) = 0;
};

class Path {
 public:
  virtual ~Path() = default;
  virtual const char *name() const = 0;  // its backend's: logs and metrics labels only
  virtual PathMode mode() const = 0;
  const Backend *owner = nullptr;  // the backend that made it (set by the registry)
  // pull: remote -> local, else local -> remote. Returns LLM_TIMEOUT when the deadline passes first;
  // once it returns, no byte of the destination changes.
  virtual llm_datadist::Status Execute(const Plan &plan, const LocalMemory &local, bool pull, int64_t deadline) = 0;
  // Non-null when this plan may share a pipelined run with every other plan of the same key (same
  // implementation, same peer); null runs it alone through Execute.
  virtual const void *PipelineKey(const Plan &, bool /*pull*/) const { return nullptr; }
  // Runs the feed's transfers, overlapping their round trips, until it has none left; every item
  // taken gets exactly one Done, each with the contracts of Execute.
  virtual void ExecutePipelined(PipeFeed *feed);
};

// memcpy into memory this process can address: another engine of this process, or a peer's memfd
// mapped here. `keep` holds the mapping.
std::unique_ptr<Path> MakeMemoryPath(const char *name, std::vector<uint8_t *> remote_tensors,
                                     std::shared_ptr<SharedRegion> keep);

// memcpy of a plan between two tensor tables of this process (also CopyKvBlocks/CopyKvCache).
llm_datadist::Status CopyPlan(const Plan &plan, uint8_t *const *src, uint8_t *const *dst, int64_t deadline);

// The served backend's other half: serves the peer's requests on one data channel until it closes;
// checks every request against this process's own cache table.
void ServeChannel(int fd, PeerLink *link, const LocalTable &caches);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_PATH_H_
