// SPDX-License-Identifier: Apache-2.0
// Prompt side, written like CANN's LLM-DataDist C++ sample: listens, registers its KV caches, lets
// the decoder pull, then pushes layer (3,3) with tensor_num_per_layer=1, blocks {0,1,2,3} -> {3,2,1,0}.
// usage: prompt PORT SYNC_DIR
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
constexpr uint64_t PROMPT_CLUSTER_ID = 1;
constexpr uint64_t DECODER_CLUSTER_ID = 2;
constexpr int NUM_TENSORS = 4;

#define CHECK_OK(expr)                                                                  \
  do {                                                                                  \
    const Status st_ = (expr);                                                          \
    if (st_ != LLM_SUCCESS) {                                                           \
      std::fprintf(stderr, "[prompt] %s failed: 0x%X\n", #expr, static_cast<unsigned>(st_)); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)
}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  const std::string port = argv[1];
  const std::string sync = argv[2];
  LlmDataDist llm_datadist(PROMPT_CLUSTER_ID, LlmRole::kPrompt);
  std::map<AscendString, AscendString> options;
  options[OPTION_DEVICE_ID] = "0";
  options[OPTION_LISTEN_IP_INFO] = ("127.0.0.1:" + port).c_str();
  CHECK_OK(llm_datadist.Initialize(options));

  // cache 1: 4 tensors INT32 [8,16] for the decoder to pull from
  std::vector<std::vector<int32_t>> pull_src(NUM_TENSORS, std::vector<int32_t>(8 * 16));
  // cache 2: 4 tensors INT32 [4,16] to push from
  std::vector<std::vector<int32_t>> push_src(NUM_TENSORS, std::vector<int32_t>(4 * 16));
  CacheDesc pull_desc;
  pull_desc.num_tensors = NUM_TENSORS;
  pull_desc.data_type = DT_INT32;
  pull_desc.shape = {8, 16};
  CacheDesc push_desc = pull_desc;
  push_desc.shape = {4, 16};
  std::vector<uint64_t> pull_addrs, push_addrs;
  for (int t = 0; t < NUM_TENSORS; ++t) {
    for (size_t i = 0; i < pull_src[t].size(); ++i) pull_src[t][i] = Pattern(1, t, static_cast<int>(i));
    for (size_t i = 0; i < push_src[t].size(); ++i) push_src[t][i] = Pattern(3, t, static_cast<int>(i));
    pull_addrs.push_back(reinterpret_cast<uint64_t>(pull_src[t].data()));
    push_addrs.push_back(reinterpret_cast<uint64_t>(push_src[t].data()));
  }
  RegisterCfg cfg;
  int64_t pull_cache_id = -1, push_cache_id = -1;
  CHECK_OK(llm_datadist.RegisterKvCache(pull_desc, pull_addrs, cfg, pull_cache_id));
  CHECK_OK(llm_datadist.RegisterKvCache(push_desc, push_addrs, cfg, push_cache_id));
  std::printf("[prompt] registered caches %lld and %lld\n", static_cast<long long>(pull_cache_id),
              static_cast<long long>(push_cache_id));
  Signal(sync, "prompt_ready");
  if (!WaitFor(sync, "decoder_pulled")) return 1;

  Cache src_cache;
  src_cache.cache_id = push_cache_id;
  src_cache.cache_desc = push_desc;
  CacheIndex dst_index{DECODER_CLUSTER_ID, 2, 0};  // the decoder's second cache
  KvCacheExtParam ext_param;
  ext_param.src_layer_range = {3, 3};
  ext_param.dst_layer_range = {3, 3};
  ext_param.tensor_num_per_layer = 1;
  CHECK_OK(llm_datadist.PushKvBlocks(src_cache, dst_index, {0, 1, 2, 3}, {3, 2, 1, 0}, ext_param));
  std::printf("[prompt] pushed layer 3\n");
  Signal(sync, "prompt_pushed");
  if (!WaitFor(sync, "decoder_done")) return 1;
  llm_datadist.UnregisterKvCache(pull_cache_id);
  llm_datadist.UnregisterKvCache(push_cache_id);
  llm_datadist.Finalize();
  std::printf("[prompt] done\n");
  return 0;
}
