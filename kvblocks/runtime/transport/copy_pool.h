// SPDX-License-Identifier: Apache-2.0
// Large one-sided copies (memcpy, process_vm_readv/writev) cut into ~1 MiB chunks that the caller's
// thread and a persistent pool of copy threads take from one counter: no thread is started per
// call, and a core busy with other work simply takes fewer chunks.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_COPY_POOL_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_COPY_POOL_H_

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "llm_datadist/llm_datadist.h"
#include "transport/plan.h"

namespace kvblocks {

// A plan cut into chunks of about chunk_bytes: whole tensor pairs when a tensor's bytes are
// small, else pieces of one tensor's segment list (the same cuts in every pair).
class Chunking {
 public:
  Chunking(const Plan &plan, uint64_t chunk_bytes);
  size_t count() const { return count_; }
  // Calls fn(pair index, piece) for every byte range of chunk c, in order.
  template <typename Fn>
  void ForEach(size_t c, Fn &&fn) const;

 private:
  struct Cut {
    size_t seg;
    uint64_t off;  // within segs[seg]
  };
  const Plan &plan_;
  size_t pairs_per_chunk_ = 1;   // when whole pairs make a chunk
  std::vector<Cut> cuts_;        // else: cut points of one tensor, front {0,0}, back {segs.size(),0}
  size_t count_ = 0;
};

// A borrowed callable Status(size_t): no allocation per call, unlike std::function.
class ChunkFn {
 public:
  template <typename F>
  ChunkFn(const F &f)  // NOLINT: implicit on purpose
      : obj_(&f), call_([](const void *o, size_t c) { return (*static_cast<const F *>(o))(c); }) {}
  llm_datadist::Status operator()(size_t c) const { return call_(obj_, c); }

 private:
  const void *obj_;
  llm_datadist::Status (*call_)(const void *, size_t);
};

// Runs fn(chunk) for every chunk in [0, n): on the caller's thread alone when `bytes` is below
// kParallelBytes, else with the copy pool helping. Stops taking chunks at the first failure and
// returns it; when it returns, no thread is still inside fn.
llm_datadist::Status RunChunks(size_t n, uint64_t bytes, ChunkFn fn);

// The pool's threads (beside the caller's): up to kMaxCopyThreads - 1, fewer on fewer CPUs.
size_t CopyThreads();

template <typename Fn>
void Chunking::ForEach(size_t c, Fn &&fn) const {
  const std::vector<Segment> &segs = plan_.segs;
  if (cuts_.empty()) {
    const size_t end = std::min(plan_.src_tensors.size(), (c + 1) * pairs_per_chunk_);
    for (size_t i = c * pairs_per_chunk_; i < end; ++i)
      for (const Segment &g : segs) fn(i, g);
    return;
  }
  const size_t per = cuts_.size() - 1, i = c / per;
  const Cut a = cuts_[c % per], b = cuts_[c % per + 1];
  for (size_t s = a.seg; s <= b.seg && s < segs.size(); ++s) {
    const uint64_t from = s == a.seg ? a.off : 0, to = s == b.seg ? b.off : segs[s].len;
    if (to > from) fn(i, Segment{segs[s].src_off + from, segs[s].dst_off + from, to - from});
  }
}

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_COPY_POOL_H_
