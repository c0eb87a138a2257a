// SPDX-License-Identifier: Apache-2.0
// Decoder side of the CANN-style pair (see cann_prompt.cpp): aclrtMalloc'd cache zeroed with
// aclrtMemset, LinkLlmClusters, PullKvBlocks {1,3,5,7} -> {0,2,4,6}, bytes read back with
// aclrtMemcpy and checked. In "switch" mode it then unlinks, becomes a PROMPT (SetRole), links
// again and checks the blocks the peer, now a DECODER, pushed: its {2,4} -> our {1,3}.
// usage: cann_decoder PORT SYNC_DIR pull|switch
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "common.h"
#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
constexpr uint64_t kPromptCluster = 1;
constexpr uint64_t kDecoderCluster = 2;
constexpr int kTensors = 2;
constexpr int kBlocks = 8;
constexpr int kBlockElems = 64;
constexpr size_t kTensorBytes = sizeof(int32_t) * kBlocks * kBlockElems;

#define CHECK(expr)                                                                                   \
  do {                                                                                                \
    const long long st_ = static_cast<long long>(expr);                                               \
    if (st_ != 0) {                                                                                   \
      std::fprintf(stderr, "[cann_decoder] %s failed: 0x%llX\n", #expr, static_cast<unsigned long long>(st_)); \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)

// Blocks of `dev` against want(tensor, block): the number of int32 elements that differ.
template <typename F>
int Differ(const std::vector<void *> &dev, F want_block) {
  int bad = 0;
  for (int t = 0; t < kTensors; ++t) {
    std::vector<int32_t> host(kBlocks * kBlockElems, -1);
    if (aclrtMemcpy(host.data(), kTensorBytes, dev[t], kTensorBytes, ACL_MEMCPY_DEVICE_TO_HOST) != ACL_SUCCESS) return -1;
    for (int b = 0; b < kBlocks; ++b) {
      const int src = want_block(b);  // source block of the prompt, or -1 for zeros
      for (int k = 0; k < kBlockElems; ++k) {
        const int32_t want = src < 0 ? 0 : Pattern(1, t, src * kBlockElems + k);
        if (host[b * kBlockElems + k] != want) ++bad;
      }
    }
  }
  return bad;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  const uint16_t port = static_cast<uint16_t>(std::stoi(argv[1]));
  const std::string sync = argv[2], mode = argv[3];
  CHECK(aclInit(nullptr));
  CHECK(aclrtSetDevice(0));
  LlmDataDist dd(kDecoderCluster, LlmRole::kDecoder);
  std::map<AscendString, AscendString> options;
  options[OPTION_DEVICE_ID] = "0";
  CHECK(dd.Initialize(options));

  std::vector<void *> dev(kTensors, nullptr);
  std::vector<uint64_t> addrs;
  for (int t = 0; t < kTensors; ++t) {
    CHECK(aclrtMalloc(&dev[t], kTensorBytes, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(dev[t], kTensorBytes, 0, kTensorBytes));
    addrs.push_back(reinterpret_cast<uint64_t>(dev[t]));
  }
  CacheDesc desc;
  desc.placement = CachePlacement::kDevice;
  desc.num_tensors = kTensors;
  desc.data_type = DT_INT32;
  desc.shape = {kBlocks, kBlockElems};
  int64_t cache_id = -1;
  CHECK(dd.RegisterKvCache(desc, addrs, RegisterCfg{}, cache_id));
  if (cache_id != 1) return 3;
  if (!WaitFor(sync, "prompt_ready", 20)) return 1;

  ClusterInfo cluster;
  cluster.remote_cluster_id = kPromptCluster;
  IpInfo local_ip, remote_ip;
  local_ip.ip = "127.0.0.1";
  remote_ip.ip = "127.0.0.1";
  remote_ip.port = port;
  cluster.local_ip_infos.push_back(local_ip);
  cluster.remote_ip_infos.push_back(remote_ip);
  std::vector<Status> rets;
  CHECK(dd.LinkLlmClusters({cluster}, rets, 5000));
  if (rets.size() != 1 || rets[0] != LLM_SUCCESS) return 4;

  Cache dst;
  dst.cache_id = cache_id;
  CHECK(dd.PullKvBlocks(CacheIndex{kPromptCluster, 1, 0}, dst, {1, 3, 5, 7}, {0, 2, 4, 6}));
  int bad = Differ(dev, [](int b) { return b % 2 == 0 ? b + 1 : -1; });
  if (bad != 0) {
    std::fprintf(stderr, "[cann_decoder] pull: %d elements differ\n", bad);
    return 5;
  }
  std::printf("[cann_decoder] pull verified\n");
  Signal(sync, "decoder_pulled");

  if (mode == "switch") {
    CHECK(dd.UnlinkLlmClusters({cluster}, rets, 5000));
    CHECK(dd.SetRole(LlmRole::kPrompt));
    Signal(sync, "decoder_unlinked");
    if (!WaitFor(sync, "prompt_switched", 20)) return 1;
    CHECK(dd.LinkLlmClusters({cluster}, rets, 5000));
    Signal(sync, "decoder_relinked");
    if (!WaitFor(sync, "prompt_pushed", 20)) return 1;
    bad = Differ(dev, [](int b) { return b == 1 ? 2 : b == 3 ? 4 : (b % 2 == 0 ? b + 1 : -1); });
    if (bad != 0) {
      std::fprintf(stderr, "[cann_decoder] push: %d elements differ\n", bad);
      return 6;
    }
    std::printf("[cann_decoder] push from a DECODER verified\n");
  }
  CHECK(dd.UnlinkLlmClusters({cluster}, rets, 5000));
  dd.Finalize();
  Signal(sync, "decoder_done");
  for (void *p : dev) CHECK(aclrtFree(p));
  CHECK(aclrtResetDevice(0));
  CHECK(aclFinalize());
  std::printf("[cann_decoder] done\n");
  return 0;
}
