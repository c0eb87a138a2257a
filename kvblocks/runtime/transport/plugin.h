// SPDX-License-Identifier: Apache-2.0
// Loading a backend plugin (transport/backend_abi.h): the one place that dlopen()s one and checks it
// is the backend asked for, of this ABI version.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_PLUGIN_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_PLUGIN_H_

#include <string>

#include "transport/backend_abi.h"

namespace kvblocks {

// The directory this runtime library was loaded from (a plugin's default home is beside it).
std::string RuntimeDir();

// Loads the plugin at `path` and returns its table, or null with the reason in *why: it cannot be
// loaded (*present tells whether the file exists), it has no entry point, it is another ABI
// version, or it implements another backend than `backend`.
const kvb_backend_api *LoadBackendPlugin(const std::string &path, const char *backend, std::string *why,
                                         bool *present);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_PLUGIN_H_
