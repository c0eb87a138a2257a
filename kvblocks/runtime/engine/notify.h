// SPDX-License-Identifier: Apache-2.0
// User notifications (hixl's send_notify / get_notifies) on a link's control connection: the
// sender waits for the receiver's NOTIFY_ACK, so SUCCESS means "queued there". The engine owns one
// Notifier; its frames are in the engine's ControlChannel table.
#ifndef KVBLOCKS_RUNTIME_ENGINE_NOTIFY_H_
#define KVBLOCKS_RUNTIME_ENGINE_NOTIFY_H_

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvblocks/ext.h"
#include "link/control.h"
#include "link/registry.h"
#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

class Notifier {
 public:
  explicit Notifier(LinkRegistry *links) : links_(links) {}
  void Register(ControlChannel *control);  // NOTIFY and NOTIFY_ACK; before any link runs

  // Sends one notification to `cluster_id` and waits for its ack. LLM_PARAM_INVALID (name, message,
  // timeout), LLM_NOT_YET_LINK, LLM_LINK_FAILED, LLM_TIMEOUT, or LLM_LINK_BUSY when the receiver's
  // queue is full; each with its reason in the last error.
  llm_datadist::Status Send(uint64_t cluster_id, const std::string &name, const std::string &message,
                            int32_t timeout_ms);
  void Take(std::vector<NotifyMessage> *out);  // every notification received and not yet taken
  void Clear();                                // Finalize: drops what was not taken

 private:
  void OnFrame(const std::shared_ptr<Link> &link, uint16_t type, const std::string &payload);

  LinkRegistry *const links_;
  std::mutex mu_;
  std::deque<NotifyMessage> queue_;  // received, not yet taken; at most kMaxQueuedNotifies
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_ENGINE_NOTIFY_H_
