// SPDX-License-Identifier: Apache-2.0
// Decoder side, written like CANN's LLM-DataDist C++ sample: links to the prompt, pulls blocks
// {1,3,5,7} -> {0,2,4,6}, then checks the prompt's push of layer 3 with reversed blocks.
// usage: decoder PORT SYNC_DIR
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "kvblocks/ext.h"
#include "kvblocks/metrics.h"
#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
constexpr uint64_t PROMPT_CLUSTER_ID = 1;
constexpr uint64_t DECODER_CLUSTER_ID = 2;
constexpr int NUM_TENSORS = 4;

#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    const Status st_ = (expr);                                                           \
    if (st_ != LLM_SUCCESS) {                                                            \
      std::fprintf(stderr, "[decoder] %s failed: 0x%X\n", #expr, static_cast<unsigned>(st_)); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)
// The pull above in this engine's metrics (include/kvblocks/metrics.h): one success on the link's
// path, 4 blocks x 64 bytes x 4 tensors, one histogram entry; and this process has one engine.
bool MetricsShowPull(LlmDataDist &dd) {
  const kvblocks::EngineMetrics m = kvblocks::ImplAccess::Metrics(dd);
  const std::string path = kvblocks::ImplAccess::LinkPath(dd, PROMPT_CLUSTER_ID);
  uint64_t count = 0, bytes = 0, hist = 0;
  for (const auto &peer : m.peers)
    for (const auto &p : peer.paths)
      for (const auto &k : p.kinds)
        if (peer.cluster_id == PROMPT_CLUSTER_ID && p.path == path && k.kind == "pull_blocks") {
          count += k.status.count("success") ? k.status.at("success") : 0;
          bytes += k.bytes;
          for (uint64_t n : k.buckets) hist += n;
        }
  const bool ok = m.version == kvblocks::kMetricsVersion && m.cluster_id == DECODER_CLUSTER_ID && count == 1 &&
                  bytes == 4 * 64 * NUM_TENSORS && hist == 1 && kvblocks::ProcessMetrics().size() == 1 &&
                  kvblocks::ProcessMetricsJson().find("\"pull_blocks\"") != std::string::npos;
  std::printf(ok ? "[decoder] metrics verified (%s)\n" : "[decoder] metrics wrong (%s)\n", path.c_str());
  return ok;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  const uint16_t port = static_cast<uint16_t>(std::stoi(argv[1]));
  const std::string sync = argv[2];
  LlmDataDist llm_datadist(DECODER_CLUSTER_ID, LlmRole::kDecoder);
  std::map<AscendString, AscendString> options;
  options[OPTION_DEVICE_ID] = "0";
  CHECK_OK(llm_datadist.Initialize(options));

  std::vector<std::vector<int32_t>> pull_dst(NUM_TENSORS, std::vector<int32_t>(8 * 16, 0));
  std::vector<std::vector<int32_t>> push_dst(NUM_TENSORS, std::vector<int32_t>(4 * 16, 0));
  CacheDesc pull_desc;
  pull_desc.num_tensors = NUM_TENSORS;
  pull_desc.data_type = DT_INT32;
  pull_desc.shape = {8, 16};
  CacheDesc push_desc = pull_desc;
  push_desc.shape = {4, 16};
  std::vector<uint64_t> pull_addrs, push_addrs;
  for (int t = 0; t < NUM_TENSORS; ++t) {
    pull_addrs.push_back(reinterpret_cast<uint64_t>(pull_dst[t].data()));
    push_addrs.push_back(reinterpret_cast<uint64_t>(push_dst[t].data()));
  }
  RegisterCfg cfg;
  int64_t pull_cache_id = -1, push_cache_id = -1;
  CHECK_OK(llm_datadist.RegisterKvCache(pull_desc, pull_addrs, cfg, pull_cache_id));
  CHECK_OK(llm_datadist.RegisterKvCache(push_desc, push_addrs, cfg, push_cache_id));
  if (pull_cache_id != 1 || push_cache_id != 2) return 1;
  if (!WaitFor(sync, "prompt_ready")) return 1;

  ClusterInfo cluster_info;
  cluster_info.remote_cluster_id = PROMPT_CLUSTER_ID;
  IpInfo local_ip, remote_ip;
  local_ip.ip = "127.0.0.1";
  remote_ip.ip = "127.0.0.1";
  remote_ip.port = port;
  cluster_info.local_ip_infos.push_back(local_ip);
  cluster_info.remote_ip_infos.push_back(remote_ip);
  std::vector<Status> rets;
  CHECK_OK(llm_datadist.LinkLlmClusters({cluster_info}, rets, 5000));

  CacheIndex src_index{PROMPT_CLUSTER_ID, 1, 0};
  Cache dst_cache;
  dst_cache.cache_id = pull_cache_id;
  CHECK_OK(llm_datadist.PullKvBlocks(src_index, dst_cache, {1, 3, 5, 7}, {0, 2, 4, 6}));
  int bad = 0;
  for (int t = 0; t < NUM_TENSORS; ++t)
    for (int b = 0; b < 8; ++b)
      for (int k = 0; k < 16; ++k) {
        const int32_t want = (b % 2 == 0) ? Pattern(1, t, (b + 1) * 16 + k) : 0;
        if (pull_dst[t][b * 16 + k] != want) ++bad;
      }
  if (bad) {
    std::fprintf(stderr, "[decoder] pull: %d elements differ\n", bad);
    return 1;
  }
  std::printf("[decoder] pull verified\n");
  if (!MetricsShowPull(llm_datadist)) return 1;
  Signal(sync, "decoder_pulled");
  if (!WaitFor(sync, "prompt_pushed")) return 1;
  const int order[4] = {3, 2, 1, 0};  // dst block d holds src block order[d]
  for (int t = 0; t < NUM_TENSORS; ++t)
    for (int d = 0; d < 4; ++d)
      for (int k = 0; k < 16; ++k) {
        const int32_t want = (t == 3) ? Pattern(3, t, order[d] * 16 + k) : 0;
        if (push_dst[t][d * 16 + k] != want) ++bad;
      }
  if (bad) {
    std::fprintf(stderr, "[decoder] push: %d elements differ\n", bad);
    return 1;
  }
  std::printf("[decoder] push verified\n");
  std::vector<Status> unlink_rets;
  CHECK_OK(llm_datadist.UnlinkLlmClusters({cluster_info}, unlink_rets, 5000));
  llm_datadist.Finalize();
  Signal(sync, "decoder_done");
  std::printf("[decoder] all data verified\n");
  return 0;
}
