// SPDX-License-Identifier: Apache-2.0
// A backend is a transport's whole life: the memory kinds it serves, the options it accepts, its
// part in registering a cache and in the cache table, attaching to a peer from what the handshake
// verified (and, for backends whose descriptors reach our memory, from an exchange after CONFIRM with
// that peer only), the Path it gives each remote cache, and teardown. Each lives in
// transport/<name>/ and keeps its state there (per engine, per cache, per peer); transport/registry.cc
// lists them in order of preference. Nothing outside transport/<name>/ names one.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mem_kind.h"
#include "llm_datadist/llm_datadist.h"
#include "transport/path.h"

namespace kvblocks {

struct PeerLink;
struct RemoteCache;
struct TableEntry;

// A backend's state for one peer (an endpoint, a pidfd, mappings, a pool of channels); the link
// holds it for its life and tells it when it goes down.
class PeerState {
 public:
  virtual ~PeerState() = default;
  virtual void OnShutdown() {}  // the link's sockets were shut down: wake whoever waits on this state
  virtual void OnFail() {}      // the link failed: let go of what it pooled (after OnShutdown)
};

// The data channels a link's served requests go out on: the served backend's state for the link,
// reached by the link's other parts through this interface (registry.h ServedChannels).
class RequestChannels : public PeerState {
 public:
  // A channel for one request: an idle one, else one more opened (opener side) or asked of the peer
  // (OPEN_REVERSE); -1 with *st (LLM_TIMEOUT at `deadline`, LLM_NOT_YET_LINK once the link is down).
  virtual int Acquire(int64_t deadline, llm_datadist::Status *st) = 0;
  virtual void Release(int fd, bool reusable) = 0;  // back to the pool, or closed
  virtual bool Reserve() = 0;    // a slot for one more channel; false at kMaxRequesterChannels
  virtual void Unreserve() = 0;  // a reserved slot whose channel never came
  virtual void Add(int fd) = 0;  // a reserved slot's channel, idle (one we opened, or the peer opened when asked)
  virtual void Refused() = 0;    // the opener will not open the reverse channel we asked for
  virtual int count() = 0;       // channels held (idle or in use)
};

// A backend's state for one engine (a worker that serves every link of it): made by NewEngineState
// when the engine first needs it, dropped when the engine finalizes (links made before keep what
// they hold of it).
class EngineState {
 public:
  virtual ~EngineState() = default;
};

// What Initialize parsed that backends decide on: offering (Offered) and refusing (CheckOptions).
struct BackendOptions {
  std::string transport = "auto";  // kvblocks.Transport: auto, or a backend's transport_option()
  bool integrity = false;          // kvblocks.Integrity=crc32c
  std::string encryption = "none";  // kvblocks.Encryption as given (Initialize checks the value)
  // Every option Initialize was given, by key: the ones a single backend decides on are its own to
  // read (Offered) and to check (CheckOptions); Initialize does not look at them.
  std::map<std::string, std::string> given;
  // The value of option `key`, `absent` when it was not given.
  std::string Get(const char *key, const std::string &absent = std::string()) const {
    auto it = given.find(key);
    return it == given.end() ? absent : it->second;
  }
};

// What a backend's exchange after CONFIRM gets from the engine making the link.
struct AttachEnv {
  int ctrl_fd = -1;  // the link's control connection (a backend may bind to its interface)
  // This backend's state for the engine (NewEngineState), held while the exchange runs; null once
  // the engine finalized.
  std::shared_ptr<EngineState> engine;
  // One of our caches by id; null when it is gone.
  std::function<std::shared_ptr<LocalMemory>(int64_t id)> find_cache;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char *name() const = 0;      // logs, metrics labels and link_path only; never compared
  virtual uint64_t capability() const = 0;   // its bit in the handshake: both sides must offer it
  virtual PathMode path_mode() const = 0;    // what its paths are
  // The kvblocks.Transport value that selects it (several backends may share one: the same-host ones).
  virtual const char *transport_option() const = 0;
  virtual bool Serves(MemKind local, MemKind remote) const {
    return local == MemKind::kHost && remote == MemKind::kHost;
  }
  // Whether this engine offers it under `o`; may load a plugin (its first use).
  virtual bool Offered(const BackendOptions &o) const = 0;
  // Whether it can run in this process at all (false with the reason, e.g. a plugin that will not load).
  virtual bool Available(std::string * /*why*/) const { return true; }
  // Initialize's check of the options: LLM_PARAM_INVALID (with the reason) for a combination this
  // backend cannot honour. Called for every backend, in order of preference.
  virtual llm_datadist::Status CheckOptions(const BackendOptions & /*o*/) const { return llm_datadist::LLM_SUCCESS; }
  // kvblocks.Transport selects this backend (with any sharing its option): whether the link may
  // stand though this backend did not attach (the link fails unless one of the option's backends
  // attached or says so). Backends that attach after CONFIRM are judged there instead
  // (AttachAfterConfirm's `required`).
  virtual bool Suits(const PeerLink & /*link*/) const { return false; }
  // Whether the link needs the same-host local exchange (a kernel-verified pid, memfds) for it.
  virtual bool NeedsLocalExchange() const { return false; }
  // Its descriptor in the cache table every linked peer receives (nothing by default). Never
  // anything that reaches memory without the owner's serving it: that goes in AttachData.
  virtual void Describe(const LocalMemory & /*cache*/, TableEntry * /*entry*/) const {}
  // The cache is gone for good (peers confirmed they stopped): drop what a registration kept for it
  // (LocalMemory::regs, keyed by the backend).
  virtual void Unregister(LocalMemory * /*cache*/) {}
  // From what `link` verified about the peer (never what the peer claims): whether this backend may
  // reach it; `*state` may receive its per-peer state. Called once both sides' capabilities are known.
  virtual bool Attach(PeerLink *link, std::shared_ptr<PeerState> *state) = 0;
  // Its path to one remote cache, null when it cannot reach that one (the next backend is asked).
  virtual std::shared_ptr<Path> PathFor(PeerLink *link, PeerState *state, RemoteCache &rc) = 0;

  // ---- the exchange after CONFIRM, for backends whose descriptors let a peer reach our memory
  // without our serving it: sent only once the peer confirmed the link, only to that peer, only
  // when both offered the backend; one BACKEND_ATTACH frame each way (the opener's first).
  virtual bool ExchangesAttachData() const { return false; }
  virtual std::shared_ptr<EngineState> NewEngineState() const { return nullptr; }
  // Our data for the link: `shown` is our link-time table as the peer got it; `refuse` (the link is
  // about to be refused) sends the form that offers nothing.
  virtual std::string AttachData(const AttachEnv & /*env*/, const std::vector<TableEntry> & /*shown*/,
                                 bool /*refuse*/) {
    return std::string();
  }
  // The peer's data, checked whole against the link's table: false when malformed or inconsistent
  // (the link fails). `*learned`: what attaching needs; null when the peer offered nothing.
  virtual bool TakeAttachData(const PeerLink & /*link*/, const std::string & /*data*/,
                              std::shared_ptr<PeerState> * /*learned*/) {
    return false;
  }
  // Attaches (Registry's AttachLater) from `learned` (null: the peer offered nothing, or the two did
  // not exchange); `required` (kvblocks.Transport selects this backend): every cache it reaches
  // takes its path. False, with *why, when it did not attach.
  virtual bool AttachAfterConfirm(const AttachEnv & /*env*/, PeerLink * /*link*/, std::shared_ptr<PeerState> /*learned*/,
                                  bool /*required*/, std::string *why) {
    *why = "this backend attaches at link time";
    return false;
  }
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_BACKEND_H_
