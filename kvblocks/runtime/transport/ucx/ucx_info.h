// SPDX-License-Identifier: Apache-2.0
// UCX_INFO, the UCX backend's attach data (the payload of its BACKEND_ATTACH frame, wire/messages.h):
// the sender's UCP worker address and, for each cache of its link-time table it serves over UCX, the
// packed rkeys and the rkey index of every tensor. Sent only after CONFIRM and only to a peer that
// offered UCX: these descriptors reach any memory of the sender (README, threat model). An empty
// worker (no caches): no UCX from this side (the acceptor refusing the link, or no worker).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_UCX_UCX_INFO_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_UCX_UCX_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvblocks {

constexpr uint32_t kMaxUcxBlob = 1U << 16;  // a UCP worker address or packed rkey in UCX_INFO

struct UcxCacheKeys {
  int64_t cache_id = 0;
  std::vector<std::string> rkeys;  // 1..kMaxTableTensors, each 1..kMaxUcxBlob bytes
  std::vector<uint32_t> key_of;    // per tensor: an index into rkeys
};

struct UcxInfo {
  std::string worker;  // at most kMaxUcxBlob bytes
  std::vector<UcxCacheKeys> caches;
};

void Encode(const UcxInfo &m, std::string *out);
bool Decode(const std::string &in, UcxInfo *m);  // false also for out-of-range counts, sizes and indices

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_UCX_UCX_INFO_H_
