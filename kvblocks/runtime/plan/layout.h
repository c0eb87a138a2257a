// SPDX-License-Identifier: Apache-2.0
// Compiles a layout transform (include/kvblocks/layout.h) into a Plan's byte segments: checked once,
// then every path executes the segments as it executes any plan (a served path's server checks each
// range against its own table, as for an untransformed transfer).
#ifndef KVBLOCKS_RUNTIME_PLAN_LAYOUT_H_
#define KVBLOCKS_RUNTIME_PLAN_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvblocks/layout.h"
#include "plan/plan.h"

namespace kvblocks {

// Every rule of a transform between blocks of src_block_bytes and dst_block_bytes, for block lists
// of ns and nd entries: "" when it holds, else why not (one sentence, for LLM_PARAM_INVALID).
std::string CheckLayout(const LayoutTransform &x, uint64_t src_block_bytes, uint64_t dst_block_bytes, size_t ns,
                        size_t nd);

// Appends the transform's segments for these block lists (CheckLayout passed) to `plan`, in
// destination order, merging ranges contiguous on both sides.
void AddLayoutBlocks(const LayoutTransform &x, const std::vector<uint64_t> &src, const std::vector<uint64_t> &dst,
                     Plan *plan);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_PLAN_LAYOUT_H_
