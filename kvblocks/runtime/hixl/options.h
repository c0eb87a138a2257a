// SPDX-License-Identifier: Apache-2.0
// hixl's initialize options and its GlobalResourceConfig JSON: parsed and range-checked as CANN
// does; on CPUs only AutoConnect and the connect pool have an effect.
#ifndef KVBLOCKS_RUNTIME_HIXL_OPTIONS_H_
#define KVBLOCKS_RUNTIME_HIXL_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>

#include "hixl/hixl_types.h"

namespace kvblocks {
namespace hixlrt {

struct HixlOptions {
  bool auto_connect = false;
  uint32_t connect_threads = 2;          // connect_pool.thread_num
  uint32_t connect_queue_capacity = 128;  // connect_pool.task_queue_capacity
};

// PARAM_INVALID (with the reason as the last error) for an unknown key or a bad value.
hixl::Status ParseOptions(const std::map<hixl::AscendString, hixl::AscendString> &options, HixlOptions *out);

// An engine name: "ip", "ip:port", "[ip6]" or "[ip6]:port" with a literal address. `port` is 0 when
// none is given or it is <= 0 (a client-only engine). False for anything else.
bool ParseEngineName(const std::string &name, std::string *ip, uint16_t *port);

}  // namespace hixlrt
}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_HIXL_OPTIONS_H_
