// SPDX-License-Identifier: Apache-2.0
#include "transport/beacon.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/util.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace kvblocks {

namespace {

constexpr size_t kPage = 4096;
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the beacon word is read across processes");

// One per process. Never destroyed: the owning thread must live until the process ends, when
// the kernel marks the word.
class Beacon {
 public:
  // nullptr when the kernel cannot give us a sealed page or a robust list.
  static Beacon *Create() {
    const int fd = memfd_create("kvblocks-beacon", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return nullptr;
    void *p = MAP_FAILED;
    if (ftruncate(fd, kPage) == 0) p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    // Future-write sealed: our mapping stays writable, a peer's cannot be (it could fake our death).
    if (p == MAP_FAILED ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
      if (p != MAP_FAILED) munmap(p, kPage);
      close(fd);
      return nullptr;
    }
    auto *b = new Beacon(fd, static_cast<std::atomic<uint32_t> *>(p));
    if (b->Start()) return b;
    return nullptr;  // the thread could not register the list: leak the page, never peer-visible
  }
  int fd() const { return fd_; }

 private:
  Beacon(int fd, std::atomic<uint32_t> *word) : fd_(fd), word_(word) {}

  bool Start() {
    AsyncSignalsBlocked quiet;
    std::thread([this] { Own(); }).detach();
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [this] { return state_ != 0; });
    return state_ == 1;
  }

  // Registers a robust list holding only the word (the list lives in this object, which is never
  // freed, so the kernel can walk it whenever the thread exits), puts its thread id in the word,
  // and sleeps for good.
  void Own() {
    entry_.next = &head_.list;
    head_.list.next = &entry_;
    head_.futex_offset = reinterpret_cast<char *>(word_) - reinterpret_cast<char *>(&entry_);
    head_.list_op_pending = nullptr;
    const bool ok = syscall(SYS_set_robust_list, &head_, sizeof(head_)) == 0;
    if (ok) word_->store(static_cast<uint32_t>(syscall(SYS_gettid)) & FUTEX_TID_MASK, std::memory_order_release);
    {
      std::lock_guard<std::mutex> g(mu_);
      state_ = ok ? 1 : 2;
    }
    cv_.notify_all();
    for (;;) pause();
  }

  const int fd_;
  std::atomic<uint32_t> *const word_;
  robust_list_head head_{};
  robust_list entry_{};
  std::mutex mu_;
  std::condition_variable cv_;
  int state_ = 0;  // 1 owned, 2 failed
};

}  // namespace

int OurBeaconFd() {
  static std::mutex mu;
  static pid_t owner = 0;
  static Beacon *beacon = nullptr;
  std::lock_guard<std::mutex> g(mu);
  // A forked child has no owning thread: its peers must watch a beacon of its own.
  if (owner != getpid()) {
    owner = getpid();
    beacon = Beacon::Create();
  }
  return beacon != nullptr ? beacon->fd() : -1;
}

std::unique_ptr<PeerBeacon> PeerBeacon::Map(int fd) {
  struct stat st;
  const int seals = fcntl(fd, F_GET_SEALS);
  void *p = MAP_FAILED;
  if (seals >= 0 && (seals & F_SEAL_SHRINK) != 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) >= kPage)
    p = mmap(nullptr, kPage, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the page
  if (p == MAP_FAILED) return nullptr;
  std::unique_ptr<PeerBeacon> b(new PeerBeacon());
  b->page_ = p;
  b->word_ = static_cast<const std::atomic<uint32_t> *>(p);
  return b;
}

PeerBeacon::~PeerBeacon() {
  if (page_ != nullptr) munmap(page_, kPage);
}

bool PeerBeacon::Alive() const {
  const uint32_t v = word_->load(std::memory_order_acquire);
  return (v & FUTEX_TID_MASK) != 0 && (v & FUTEX_OWNER_DIED) == 0;
}

}  // namespace kvblocks
