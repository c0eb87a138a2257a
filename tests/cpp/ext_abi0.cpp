// SPDX-License-Identifier: Apache-2.0
// kvblocks/ext.h calls with std::string in their signature or structs must not link into a client
// built with a different _GLIBCXX_USE_CXX11_ABI than the library (they would misread the strings).
// tests/test_cann_cpp_samples.py builds this with -D_GLIBCXX_USE_CXX11_ABI=0 (expects link errors
// naming exactly these calls) and with the default ABI (links).
#include <vector>

#include "kvblocks/ext.h"

int main() {
  llm_datadist::LlmDataDist dd(1, llm_datadist::LlmRole::kMix);
  std::vector<kvblocks::NotifyMessage> got;
  kvblocks::ImplAccess::GetNotifies(dd, got);
  kvblocks::ImplAccess::SendNotify(dd, 2, "name", "message", 100);
  const bool linked = !kvblocks::ImplAccess::LinkPath(dd, 2).empty();
  return kvblocks::ImplAccess::HasLinks(dd) || linked ? 1 : 0;  // HasLinks: ABI-neutral, links either way
}
