// SPDX-License-Identifier: Apache-2.0
// A link's control connection: one loop per link reads its frames and dispatches each by type
// through a handler table. The link's own frames (unlink, cache-gone, reverse-refused) are
// registered here; engine features register theirs (notify, keys, late caches, reverse channels)
// when the engine is made, so a new control frame is one On() call, not an edit of the loop.
#ifndef KVBLOCKS_RUNTIME_LINK_CONTROL_H_
#define KVBLOCKS_RUNTIME_LINK_CONTROL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "link/link.h"
#include "link/registry.h"

namespace kvblocks {

class ControlChannel {
 public:
  // Handles one frame of the link's control connection; false ends the loop (the link is then
  // failed and its control connection closed). Runs on the link's control thread.
  using Handler = std::function<bool(const std::shared_ptr<Link> &link, const FrameHeader &h, const std::string &payload)>;

  // `links`: where an UNLINK removes the link from before it is acknowledged.
  explicit ControlChannel(LinkRegistry *links);
  ControlChannel(const ControlChannel &) = delete;
  ControlChannel &operator=(const ControlChannel &) = delete;

  // Registers the handler of frames of `type`, replacing any; only before the first Run (the table
  // is read without a lock). Frames of a type without a handler are read and dropped.
  void On(uint16_t type, Handler h);
  // Serves `link`'s control connection until it closes, the peer's process exits or a handler
  // says stop; then the link is failed and its control connection closed. Raises nothing.
  void Run(std::shared_ptr<Link> link) const;

 private:
  LinkRegistry *links_;
  std::map<uint16_t, Handler> handlers_;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_CONTROL_H_
