// SPDX-License-Identifier: Apache-2.0
// Prompt side of a CANN-style program pair built like CANN's own C++ samples (with
// -D_GLIBCXX_USE_CXX11_ABI=0 and acl/acl.h): caches allocated with aclrtMalloc and filled with
// aclrtMemcpy, registered with RegisterKvCache; the decoder links and pulls. Default options only.
// In "switch" mode it then becomes a DECODER (SetRole) and pushes into the peer, as CANN's
// switch-roles sample does (CANN V2: transfers do not depend on the role).
// usage: cann_prompt PORT SYNC_DIR pull|switch
#include <cstdio>
#include <cstring>
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

#define CHECK(expr)                                                                                  \
  do {                                                                                               \
    const long long st_ = static_cast<long long>(expr);                                              \
    if (st_ != 0) {                                                                                  \
      std::fprintf(stderr, "[cann_prompt] %s failed: 0x%llX\n", #expr, static_cast<unsigned long long>(st_)); \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)
}  // namespace

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  const std::string port = argv[1], sync = argv[2], mode = argv[3];
  CHECK(aclInit(nullptr));
  CHECK(aclrtSetDevice(0));
  LlmDataDist dd(kPromptCluster, LlmRole::kPrompt);
  std::map<AscendString, AscendString> options;
  options[OPTION_DEVICE_ID] = "0";
  options[OPTION_LISTEN_IP_INFO] = ("127.0.0.1:" + port).c_str();
  CHECK(dd.Initialize(options));

  std::vector<void *> dev(kTensors, nullptr);
  std::vector<uint64_t> addrs;
  for (int t = 0; t < kTensors; ++t) {
    CHECK(aclrtMalloc(&dev[t], kTensorBytes, ACL_MEM_MALLOC_HUGE_FIRST));
    std::vector<int32_t> host(kBlocks * kBlockElems);
    for (size_t i = 0; i < host.size(); ++i) host[i] = Pattern(1, t, static_cast<int>(i));
    CHECK(aclrtMemcpy(dev[t], kTensorBytes, host.data(), kTensorBytes, ACL_MEMCPY_HOST_TO_DEVICE));
    addrs.push_back(reinterpret_cast<uint64_t>(dev[t]));
  }
  CacheDesc desc;
  desc.placement = CachePlacement::kDevice;
  desc.num_tensors = kTensors;
  desc.data_type = DT_INT32;
  desc.shape = {kBlocks, kBlockElems};
  int64_t cache_id = -1;
  CHECK(dd.RegisterKvCache(desc, addrs, RegisterCfg{}, cache_id));
  std::printf("[cann_prompt] registered cache %lld\n", static_cast<long long>(cache_id));
  Signal(sync, "prompt_ready");
  if (!WaitFor(sync, "decoder_pulled", 20)) return 1;

  if (mode == "switch") {
    // The decoder unlinked; switch roles as CANN's sample does, keep listening, and push once the
    // decoder (now a PROMPT) has linked again.
    if (!WaitFor(sync, "decoder_unlinked", 20)) return 1;
    std::map<AscendString, AscendString> role_options;
    role_options[OPTION_LISTEN_IP_INFO] = ("127.0.0.1:" + port).c_str();
    CHECK(dd.SetRole(LlmRole::kDecoder, role_options));
    Signal(sync, "prompt_switched");
    if (!WaitFor(sync, "decoder_relinked", 20)) return 1;
    Cache src;
    src.cache_id = cache_id;
    src.cache_desc = desc;
    CacheIndex dst{kDecoderCluster, 1, 0};  // the peer's first (and only) cache
    CHECK(dd.PushKvBlocks(src, dst, {2, 4}, {1, 3}));
    std::printf("[cann_prompt] pushed as DECODER\n");
    Signal(sync, "prompt_pushed");
  }
  if (!WaitFor(sync, "decoder_done", 20)) return 1;
  CHECK(dd.UnregisterKvCache(cache_id));
  dd.Finalize();
  for (void *p : dev) CHECK(aclrtFree(p));
  CHECK(aclrtResetDevice(0));
  CHECK(aclFinalize());
  std::printf("[cann_prompt] done\n");
  return 0;
}
