// SPDX-License-Identifier: Apache-2.0
// The control connection of a link (link/control.h): its loop, its handler table and the link's
// own frames. When it closes, the link is dead on both sides.
#include <errno.h>
#include <poll.h>

#include "link/control.h"

#include "common/limits.h"
#include "common/util.h"
#include "net/socket.h"
#include "transport/registry.h"

namespace kvblocks {

namespace {
// The peer unregistered one of its caches: wait for our one-sided copies of it, then stop using it.
void MarkGone(struct Link *link, int64_t id) {
  std::shared_ptr<RemoteCache> rc = link->FindCache(id);  // link-time or learned later (CACHE_QUERY)
  if (rc == nullptr) return;
  std::unique_lock<std::shared_mutex> g(rc->live->mu);
  rc->live->gone = true;
  g.unlock();
  link->ForgetLate(id);  // a late one: transfers holding it see it gone; later calls ask again
}

// Waits until the control connection is readable or closed: true. False once the verified same-host
// peer process has exited (its pidfd is readable): a process that forked may leave its end of the
// socket open in a child, so the socket alone would not say so, and the link is failed at once
// rather than at its next one-sided copy.
bool WaitCtrl(int fd, int pidfd) {
  if (Buffered(fd)) return true;  // TLS: a frame already read from the socket
  pollfd p[2] = {{fd, POLLIN, 0}, {pidfd, POLLIN, 0}};
  for (;;) {
    const int n = poll(p, pidfd >= 0 ? 2 : 1, -1);
    if (n > 0) return pidfd < 0 || (p[1].revents & POLLIN) == 0;
    if (n < 0 && errno != EINTR) return true;  // the read below reports the error
  }
}
// Wakes UnlinkOne: both ends unlinking at once, the peer's UNLINK answers our own as well, even one
// that has not sent its UNLINK yet -- both sides want the link gone, and it is.
void AckUnlink(Link *link) {
  std::lock_guard<std::mutex> g(link->mu);
  link->unlink_acked = true;
  link->cv.notify_all();
}
}  // namespace

ControlChannel::ControlChannel(LinkRegistry *links) : links_(links) {
  On(kUnlink, [this](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &) {
    AckUnlink(link.get());
    // Remove the link before acknowledging, so nothing the peer does after our ack still sees it.
    if (link->alive.exchange(false)) metrics::Add(link->stats->unlinks);
    links_->Erase(link);
    link->SendCtrl(kUnlinkAck, NowNs() + kSecNs);
    link->Fail();
    links_->Erase(link);
    return false;
  });
  On(kUnlinkAck, [](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &) {
    AckUnlink(link.get());
    return true;
  });
  On(kCacheGone, [](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &payload) {
    CacheRef ref;
    if (!Decode(payload, &ref)) return true;
    MarkGone(link.get(), ref.cache_id);
    link->SendCtrl(kCacheGoneAck, NowNs() + kHandshakeNs, payload);
    return true;
  });
  On(kCacheGoneAck, [](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &payload) {
    CacheRef ref;
    if (!Decode(payload, &ref)) return true;
    std::lock_guard<std::mutex> g(link->mu);
    link->gone_acked.insert(ref.cache_id);
    link->cv.notify_all();
    return true;
  });
  On(kReverseRefused, [](const std::shared_ptr<Link> &link, const FrameHeader &, const std::string &) {
    RequestChannels *channels = ServedChannels(*link);
    if (!link->opener && channels != nullptr) channels->Refused();
    return true;
  });
}

void ControlChannel::On(uint16_t type, Handler h) { handlers_[type] = std::move(h); }

void ControlChannel::Run(std::shared_ptr<Link> link) const {
  const int fd = link->ctrl_fd;
  for (;;) {
    FrameHeader h;
    std::string payload;
    if (!WaitCtrl(fd, link->local.pidfd)) {
      LogInfo("cluster %llu: its process exited", static_cast<unsigned long long>(link->remote_cluster_id));
      break;
    }
    // A frame longer than its type may be (kPayloadLimits; CACHE_INFO: one table entry) is refused
    // from its header, and the link with it.
    if (RecvHeader(fd, &h, 0) != IoResult::kOk ||
        RecvPayload(fd, h, Channel::kControl, &payload, NowNs() + kHandshakeNs) != IoResult::kOk)
      break;
    auto it = handlers_.find(h.type);
    if (it != handlers_.end() && !it->second(link, h, payload)) break;
  }
  // The peer closed the control connection (exit, crash, unlink or finalize): the link is gone.
  if (link->alive.load()) LogInfo("link to cluster %llu lost", static_cast<unsigned long long>(link->remote_cluster_id));
  link->Fail();
  link->CloseCtrl();
}

}  // namespace kvblocks
