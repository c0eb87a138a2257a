// SPDX-License-Identifier: Apache-2.0
// The served backend's state for one link: the pool of data channels its requests go out on. Only
// the opener connects; the acceptor asks the opener for more (OPEN_REVERSE) and takes the ones it
// opens (the linker hands them over through RequestChannels, transport/backend.h).
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_TCP_CHANNELS_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_TCP_CHANNELS_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/backend.h"

namespace kvblocks {

class TcpChannels : public RequestChannels, public std::enable_shared_from_this<TcpChannels> {
 public:
  explicit TcpChannels(PeerLink *link) : link_(link) {}
  int Acquire(int64_t deadline, llm_datadist::Status *st) override;
  void Release(int fd, bool reusable) override;
  bool Reserve() override;
  void Unreserve() override;
  void Add(int fd) override;
  void Refused() override;
  int count() override;
  void OnShutdown() override;
  void OnFail() override;

 private:
  PeerLink *const link_;  // owns this state
  std::mutex mu_;     // guards the fields below
  std::condition_variable cv_;
  std::vector<int> idle_;  // channels not in use
  int held_ = 0;           // channels held or reserved, idle or in use
  int pending_reverse_ = 0;  // OPEN_REVERSE sent, neither opened nor refused yet
  int64_t reverse_refused_at_ = 0;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_TCP_CHANNELS_H_
