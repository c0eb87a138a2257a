// SPDX-License-Identifier: Apache-2.0
// The listener: the accept loop on llm.ListenIpInfo, and the connections accepted but not yet
// authenticated. Each of those holds one of kMaxHandshakes slots without a thread until its whole
// HELLO has arrived (a connect flood costs an accept and a close each); then a runtime thread hands
// it to the handshake (ListenerHost::Handshake). What it needs of its owner comes through
// ListenerHost, so link/ knows no engine.
#ifndef KVBLOCKS_RUNTIME_LINK_LISTENER_H_
#define KVBLOCKS_RUNTIME_LINK_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

// What the listener asks of its owner. Called from the listener's own thread.
class ListenerHost {
 public:
  virtual bool Spawn(std::function<void()> fn) = 0;  // a runtime thread; false when none started
  // An accepted connection whose HELLO is here (or that closed): authenticates and serves it, on
  // the thread Spawn started. The fd is the callee's from then on.
  virtual void Handshake(int fd) = 0;

 protected:
  ~ListenerHost() = default;
};

class Listener {
 public:
  // `stopping`: set by the owner's Finalize; the loop then ends and new connections are shut.
  Listener(ListenerHost *host, const std::atomic<bool> *stopping) : host_(host), stopping_(stopping) {}
  Listener(const Listener &) = delete;
  Listener &operator=(const Listener &) = delete;

  // Binds ip:port (port 0: the kernel chooses) and starts the accept loop on a host thread.
  // Returns LLM_SUCCESS, LLM_FAILED while stopping or when no thread started, or ListenTcp's
  // status (bind or listen failed, set as the last error).
  llm_datadist::Status Start(const std::string &ip, uint32_t port);
  // Ends the accept loop (its thread closes the socket and every connection still in a slot
  // without a thread). No-op when not listening.
  void Stop();
  // Listening on exactly ip:port as asked (port 0 stays 0).
  bool ListeningOn(const std::string &ip, uint32_t port);
  // "ip:port" or "[ip6]:port", with the port as bound; "" when not listening.
  std::string Address();

  // Sockets still handshaking (accepted here, or opened by the linker): Finalize wakes them.
  void TrackLoose(int fd);
  void ForgetLoose(int fd);
  void WakeLoose();  // shutdown() of every loose socket: their handshakes fail at once
  // Takes an accepted connection out of the slots; false when the listener dropped it already.
  bool LeavePreauth(int fd);

 private:
  void Loop(int lfd);
  void AcceptBatch(int lfd);    // accepts what is queued, each into a slot
  void Admit(int fd);           // under mu_: a slot, dropping the oldest when full
  void StartHandshake(int fd);  // its HELLO is here (or it closed): a thread takes it
  void Expire(bool all);        // closes waiting connections past kAuthNs (all: every one)

  ListenerHost *const host_;
  const std::atomic<bool> *const stopping_;

  std::mutex mu_;  // everything below
  int fd_ = -1;
  std::string ip_;
  uint32_t port_ = 0;         // as asked (0: any)
  uint16_t bound_port_ = 0;   // as bound
  std::set<int> loose_;       // sockets still handshaking
  // Accepted, not yet authenticated (the kMaxHandshakes slots): fd -> accept time, and whether a
  // handshake thread has it. Until its whole HELLO has arrived a connection waits in Loop's poll.
  struct Preauth {
    int64_t since;
    bool threaded;
  };
  std::map<int, Preauth> preauth_;
  int64_t logged_ = 0;  // when a dropped slot was last logged: a flood logs once a second
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_LINK_LISTENER_H_
