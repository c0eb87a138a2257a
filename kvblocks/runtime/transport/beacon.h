// SPDX-License-Identifier: Apache-2.0
// A liveness word the kernel itself clears when this process dies, readable by same-host peers
// without a system call. A runtime thread owns a robust futex word in a one-page memfd; at that
// thread's exit (the process's death, SIGKILL included) the kernel marks the word FUTEX_OWNER_DIED
// before the process can be reaped. Peers receive the memfd in the verified local exchange (as cache
// id kBeaconId), map it read-only, and check the word before and after every shared-memory copy:
// as synchronous as polling the pidfd, at the cost of a load instead of two system calls.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_BEACON_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_BEACON_H_

#include <atomic>
#include <cstdint>
#include <memory>

namespace kvblocks {

constexpr int64_t kBeaconId = 0;  // the local exchange's id for the beacon (cache ids start at 1)

// This process's beacon memfd (created on first use, one per process, re-created in a forked
// child); -1 where the kernel lacks robust futexes or write-sealing, and peers then poll our pidfd.
int OurBeaconFd();

// A peer's beacon, mapped read-only. What it says binds only that peer's own memory: a peer that
// fakes it can keep us copying into the mapping of its memfd that we hold, nothing else.
class PeerBeacon {
 public:
  // Takes `fd`; nullptr (fd closed) unless it is a sealed memfd of at least one page.
  static std::unique_ptr<PeerBeacon> Map(int fd);
  ~PeerBeacon();
  PeerBeacon(const PeerBeacon &) = delete;
  PeerBeacon &operator=(const PeerBeacon &) = delete;
  // The owning thread lives: its id is in the word and the kernel has not marked it dead.
  bool Alive() const;

 private:
  PeerBeacon() = default;
  const std::atomic<uint32_t> *word_ = nullptr;
  void *page_ = nullptr;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_BEACON_H_
