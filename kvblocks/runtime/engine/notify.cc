// SPDX-License-Identifier: Apache-2.0
// User notifications (hixl's send_notify / get_notifies) on a link's control connection. The
// sender waits for the receiver's ack, so SUCCESS means "queued there". Ordering: every transfer
// call returns only once its bytes have landed (pulls in our memory, pushes acknowledged by the
// peer or written one-sided), so a notification sent after it is received after the data.
#include <chrono>

#include "common/error.h"
#include "common/util.h"
#include "engine/engine.h"
#include "engine/notify.h"
#include "net/socket.h"
#include "wire/messages.h"

namespace kvblocks {

Status Impl::SendNotify(uint64_t cluster_id, const std::string &name, const std::string &message,
                        int32_t timeout_ms) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  return notify_->Send(cluster_id, name, message, timeout_ms);
}

Status Impl::GetNotifies(std::vector<NotifyMessage> *out) {
  std::shared_lock<std::shared_mutex> lk(state_mu_);
  out->clear();
  if (!initialized()) return Fail(LLM_FAILED, "the engine is not initialized");
  notify_->Take(out);
  return LLM_SUCCESS;
}

void Notifier::Register(ControlChannel *control) {
  auto on = [this](const std::shared_ptr<Link> &link, const FrameHeader &h, const std::string &payload) {
    OnFrame(link, h.type, payload);
    return true;
  };
  control->On(kNotify, on);
  control->On(kNotifyAck, on);
}

Status Notifier::Send(uint64_t cluster_id, const std::string &name, const std::string &message, int32_t timeout_ms) {
  if (name.size() > kMaxNotifyName)
    return Fail(LLM_PARAM_INVALID, "notify name has %zu bytes (at most %zu)", name.size(), kMaxNotifyName);
  if (timeout_ms <= 0) return Fail(LLM_PARAM_INVALID, "timeout %d ms must be > 0", timeout_ms);
  if (message.size() > kMaxNotifyMessage)
    return Fail(LLM_PARAM_INVALID, "notify message has %zu bytes (at most %zu)", message.size(), kMaxNotifyMessage);
  auto link = links_->FindAlive(cluster_id);
  if (!link) return Fail(LLM_NOT_YET_LINK, "cluster %llu is not linked", static_cast<unsigned long long>(cluster_id));
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * kMsNs;
  Notify m;
  {
    std::lock_guard<std::mutex> g(link->mu);
    m.seq = ++link->notify_seq;
  }
  m.name = name;
  m.message = message;
  std::string payload;
  Encode(m, &payload);
  if (!link->SendCtrl(kNotify, deadline, payload))
    return Fail(NowNs() >= deadline ? LLM_TIMEOUT : LLM_LINK_FAILED, "cannot send the notification to cluster %llu",
                static_cast<unsigned long long>(cluster_id));
  std::unique_lock<std::mutex> g(link->mu);
  for (;;) {
    auto it = link->notify_acks.find(m.seq);
    if (it != link->notify_acks.end()) {
      const uint32_t st = it->second;
      link->notify_acks.erase(it);
      if (st == LLM_SUCCESS) metrics::Add(link->stats->notifies_sent);
      if (st == LLM_SUCCESS) return LLM_SUCCESS;
      return Fail(LLM_LINK_BUSY, "cluster %llu holds %zu undelivered notifications; retry later",
                  static_cast<unsigned long long>(cluster_id), kMaxQueuedNotifies);
    }
    if (!link->alive.load())
      return Fail(LLM_LINK_FAILED, "the link to cluster %llu failed", static_cast<unsigned long long>(cluster_id));
    const int64_t left = deadline - NowNs();
    if (left <= 0) {
      // A late ack is dropped by OnFrame: nobody waits for it any more.
      return Fail(LLM_TIMEOUT, "cluster %llu did not acknowledge the notification within %d ms",
                  static_cast<unsigned long long>(cluster_id), timeout_ms);
    }
    // Link::Fail does not signal cv: look at `alive` every few ms.
    link->cv.wait_for(g, std::chrono::nanoseconds(std::min<int64_t>(left, 5 * kMsNs)));
  }
}

void Notifier::OnFrame(const std::shared_ptr<Link> &link, uint16_t type, const std::string &payload) {
  Notify m;
  if (!Decode(payload, &m)) {
    LogWarn("cluster %llu sent a malformed notification; ignored",
            static_cast<unsigned long long>(link->remote_cluster_id));
    return;
  }
  if (type == kNotifyAck) {
    std::lock_guard<std::mutex> g(link->mu);
    // Only an ack of a notification we sent and whose sender may still wait: a peer cannot make
    // this map grow beyond our own sends.
    if (m.seq == 0 || m.seq > link->notify_seq) return;
    link->notify_acks[m.seq] = m.status;
    if (link->notify_acks.size() > kMaxQueuedNotifies) link->notify_acks.erase(link->notify_acks.begin());
    link->cv.notify_all();
    return;
  }
  Notify ack;
  ack.seq = m.seq;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (queue_.size() >= kMaxQueuedNotifies) {
      ack.status = LLM_LINK_BUSY;
    } else {
      queue_.push_back(NotifyMessage{link->remote_cluster_id, std::move(m.name), std::move(m.message)});
      metrics::Add(link->stats->notifies_received);
    }
  }
  std::string out;
  Encode(ack, &out);
  link->SendCtrl(kNotifyAck, NowNs() + kSecNs, out);
}

void Notifier::Take(std::vector<NotifyMessage> *out) {
  std::deque<NotifyMessage> taken;
  {
    std::lock_guard<std::mutex> g(mu_);
    taken.swap(queue_);
  }
  out->reserve(out->size() + taken.size());
  for (auto &n : taken) out->push_back(std::move(n));
}

void Notifier::Clear() {
  std::lock_guard<std::mutex> g(mu_);
  queue_.clear();
}

}  // namespace kvblocks
