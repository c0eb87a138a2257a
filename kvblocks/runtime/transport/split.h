// SPDX-License-Identifier: Apache-2.0
// Splits a large one-sided copy by tensor pairs over a few threads.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_SPLIT_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_SPLIT_H_

#include <algorithm>
#include <system_error>
#include <thread>
#include <vector>

#include "common/limits.h"
#include "common/util.h"
#include "llm_datadist/llm_datadist.h"
#include "plan/plan.h"

namespace kvblocks {

// Runs fn(begin, end) over the plan's tensor pairs, split over up to kMaxCopyThreads threads when
// the plan is large. Returns the first failure.
template <typename Fn>
llm_datadist::Status RunSplit(const Plan &plan, Fn &&fn) {
  const size_t n = plan.src_tensors.size();
  static const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t parts = plan.total_bytes() < kParallelBytes ? 1 : std::min<size_t>({hw, kMaxCopyThreads, n});
  if (parts <= 1) return fn(0, n);
  std::vector<llm_datadist::Status> st(parts, llm_datadist::LLM_SUCCESS);
  std::vector<std::thread> threads;
  threads.reserve(parts - 1);
  size_t k = 1;
  try {
    AsyncSignalsBlocked quiet;  // the helpers start with signals blocked, as every runtime thread
    for (; k < parts; ++k) threads.emplace_back([&, k] { st[k] = fn(n * k / parts, n * (k + 1) / parts); });
  } catch (const std::system_error &) {
    // No thread to be had: the caller's thread copies what is left.
  }
  st[0] = fn(0, n / parts);
  for (size_t j = k; j < parts; ++j) st[j] = fn(n * j / parts, n * (j + 1) / parts);
  for (auto &t : threads) t.join();
  for (llm_datadist::Status x : st)
    if (x != llm_datadist::LLM_SUCCESS) return x;
  return llm_datadist::LLM_SUCCESS;
}

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_SPLIT_H_
