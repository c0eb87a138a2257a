// SPDX-License-Identifier: Apache-2.0
// Option maps built in a client compiled with -D_GLIBCXX_USE_CXX11_ABI=0 (CANN's flag) are read
// correctly by the library: a good Initialize succeeds and listens where asked, bad values fail
// with LLM_PARAM_INVALID and the reason names the option. usage: abi_options PORT
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "kvblocks/error.h"
#include "llm_datadist/llm_datadist.h"

using namespace llm_datadist;

namespace {
int Expect(const char *what, Status got, Status want, const char *reason_part) {
  if (got != want) {
    std::fprintf(stderr, "[abi_options] %s: status 0x%X, want 0x%X (%s)\n", what, got, want,
                 kvblocks::LastErrorMessage());
    return 1;
  }
  if (reason_part != nullptr && std::strstr(kvblocks::LastErrorMessage(), reason_part) == nullptr) {
    std::fprintf(stderr, "[abi_options] %s: reason \"%s\" does not name %s\n", what, kvblocks::LastErrorMessage(),
                 reason_part);
    return 1;
  }
  std::printf("[abi_options] %s: 0x%X as expected\n", what, got);
  return 0;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  const std::string listen = std::string("127.0.0.1:") + argv[1];
  int bad = 0;
  {
    LlmDataDist dd(1, LlmRole::kPrompt);
    std::map<AscendString, AscendString> options;
    options[OPTION_DEVICE_ID] = "0";
    options[OPTION_LISTEN_IP_INFO] = listen.c_str();
    options[OPTION_SYNC_CACHE_WAIT_TIME] = "2500";
    bad += Expect("Initialize(DeviceId, ListenIpInfo)", dd.Initialize(options), LLM_SUCCESS, nullptr);
    // Listening where asked: a second engine on the same port cannot.
    LlmDataDist other(2, LlmRole::kPrompt);
    Status st = other.Initialize(options);
    if (st == LLM_SUCCESS) {
      std::fprintf(stderr, "[abi_options] a second listener on %s succeeded\n", listen.c_str());
      ++bad;
    }
    std::map<AscendString, AscendString> role_options{{OPTION_LISTEN_IP_INFO, listen.c_str()}};
    bad += Expect("SetRole(kDecoder, same listen)", dd.SetRole(LlmRole::kDecoder, role_options), LLM_SUCCESS, nullptr);
    dd.Finalize();
  }
  {
    LlmDataDist dd(3, LlmRole::kDecoder);
    std::map<AscendString, AscendString> options{{OPTION_DEVICE_ID, "zero"}};
    bad += Expect("Initialize(DeviceId=zero)", dd.Initialize(options), LLM_PARAM_INVALID, "llm.DeviceId=\"zero\"");
    options = {{OPTION_DEVICE_ID, "0"}, {OPTION_LISTEN_IP_INFO, "127.0.0.1"}};
    bad += Expect("Initialize(ListenIpInfo without port)", dd.Initialize(options), LLM_PARAM_INVALID,
                  "llm.ListenIpInfo=\"127.0.0.1\"");
    options = {{OPTION_LISTEN_IP_INFO, listen.c_str()}};
    bad += Expect("Initialize(no DeviceId)", dd.Initialize(options), LLM_PARAM_INVALID, "llm.DeviceId");
  }
  if (bad != 0) return 1;
  std::printf("[abi_options] all options read correctly\n");
  return 0;
}
