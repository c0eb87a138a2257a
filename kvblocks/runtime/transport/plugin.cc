// SPDX-License-Identifier: Apache-2.0
#include "transport/plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>

namespace kvblocks {

std::string RuntimeDir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&RuntimeDir), &info) == 0 || info.dli_fname == nullptr) return "";
  std::string dir = info.dli_fname;
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? std::string(".") : dir.substr(0, slash);
}

const kvb_backend_api *LoadBackendPlugin(const std::string &path, const char *backend, std::string *why,
                                         bool *present) {
  *present = access(path.c_str(), F_OK) == 0;
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char *e = dlerror();
    *why = e != nullptr ? e : path;
    return nullptr;
  }
  auto entry = reinterpret_cast<kvb_backend_entry_fn>(dlsym(h, KVB_BACKEND_ENTRY));
  const kvb_backend_api *api = entry != nullptr ? entry() : nullptr;
  // The version first: a plugin of another version may lay out the rest of the table differently.
  // It stays loaded (as a refused plugin always did): unloading a library whose dependencies may
  // have started threads is not safe.
  if (api == nullptr || api->abi != KVB_BACKEND_ABI_VERSION || api->name == nullptr ||
      strcmp(api->name, backend) != 0) {
    *why = path + ": not a kvblocks " + backend + " plugin of backend ABI version " +
           std::to_string(KVB_BACKEND_ABI_VERSION);
    return nullptr;
  }
  return api;
}

}  // namespace kvblocks
