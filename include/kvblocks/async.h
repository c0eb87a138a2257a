// SPDX-License-Identifier: Apache-2.0
// Asynchronous and batched block transfers: a kvblocks extension (CANN's LlmDataDist has no
// asynchronous call). Submission runs every check of the synchronous call, in CANN's order and with
// the same statuses, on the caller's thread; the bytes then move on a runtime worker thread and the
// returned handle completes without any help from the caller.
#ifndef KVBLOCKS_ASYNC_H_
#define KVBLOCKS_ASYNC_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kvblocks/ext_types.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

struct TransferState;

// One submitted transfer. Copies share the transfer; any thread may wait on it. Dropping every
// copy does not cancel the transfer: it still ends by its deadline. An empty handle (default
// constructed, or left by a failed submission) is done with LLM_FAILED.
class KVBLOCKS_API TransferHandle {
 public:
  TransferHandle() noexcept = default;
  explicit TransferHandle(std::shared_ptr<TransferState> s) noexcept : s_(std::move(s)) {}

  bool Valid() const noexcept { return s_ != nullptr; }
  // True once the runtime has finished with the transfer's memory (successfully or not).
  bool Done() const noexcept;
  // Blocks until the transfer is done or `timeout_ms` passed (< 0: no limit) and returns the
  // transfer's status, or LLM_WAIT_PROC_TIMEOUT when the caller's timeout passed first: the
  // transfer is then still in flight and may be waited on again. On a failure the reason becomes
  // this thread's kvblocks::LastErrorMessage(), as after a synchronous call.
  llm_datadist::Status Wait(int64_t timeout_ms = -1) const noexcept;
  // The transfer's status once Done(); LLM_WAIT_PROC_TIMEOUT while it is in flight.
  llm_datadist::Status Status() const noexcept;
  // Why it failed ("" on success or while in flight); valid while this handle lives.
  const char *Message() const noexcept;

 private:
  std::shared_ptr<TransferState> s_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_ASYNC_H_
