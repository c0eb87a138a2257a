// SPDX-License-Identifier: Apache-2.0
// Layout transforms and prepared transfers: a kvblocks extension (CANN has no such call).
//
// A block of a described tensor holds tokens_per_block tokens of kv_heads heads of head_size
// elements of elem_size bytes, in NHD ([token, head, dim]) or HND ([head, token, dim]) order; its
// bytes must be the cache's block size exactly. A transfer between two described layouts moves heads
// [src_head_begin, +num_heads) of every source token into heads [dst_head_begin, +num_heads) of the
// destination token at the same position of the token stream: the source blocks, in list order,
// hold the same tokens as the destination blocks in theirs (the lists tile), so a 16-token source
// layout fills a 32-token destination two blocks to one. Head size and element size must match.
#ifndef KVBLOCKS_LAYOUT_H_
#define KVBLOCKS_LAYOUT_H_

#include <cstdint>
#include <memory>

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct BlockLayout {
  uint32_t tokens_per_block = 0;
  uint32_t kv_heads = 0;
  uint32_t head_size = 0;  // elements
  uint32_t elem_size = 0;  // bytes
  bool hnd = false;        // false: NHD [token, head, dim]; true: HND [head, token, dim]
};

struct LayoutTransform {
  BlockLayout src, dst;
  uint32_t src_head_begin = 0, dst_head_begin = 0;
  uint32_t num_heads = 0;  // 0: every source head from src_head_begin on
};

struct PreparedState;

// What one execution of a prepared transfer moves (ImplAccess::DescribePrepared).
struct PreparedInfo {
  uint64_t bytes = 0;     // in all
  uint64_t segments = 0;  // byte ranges per tensor pair, after merging
  uint64_t pairs = 0;     // tensor pairs
};

// A transfer checked and planned once (ImplAccess::PrepareBlocksTransfer), executed any number of
// times (ImplAccess::ExecutePrepared). Copies share it; executions of one plan run one at a time.
class PreparedTransfer {
 public:
  PreparedTransfer() noexcept = default;
  explicit PreparedTransfer(std::shared_ptr<PreparedState> s) noexcept : s_(std::move(s)) {}
  bool Valid() const noexcept { return s_ != nullptr; }
  const std::shared_ptr<PreparedState> &state() const noexcept { return s_; }

 private:
  std::shared_ptr<PreparedState> s_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_LAYOUT_H_
