// SPDX-License-Identifier: Apache-2.0
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_CMA_CMA_PATH_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_CMA_CMA_PATH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "transport/path.h"

namespace kvblocks {

// process_vm_readv/writev on a same-host peer's registered memory.
std::unique_ptr<Path> MakeCmaPath(int pid, std::vector<uint64_t> remote_tensors);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_CMA_CMA_PATH_H_
