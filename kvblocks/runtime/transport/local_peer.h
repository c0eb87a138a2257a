// SPDX-License-Identifier: Apache-2.0
// Facts about a same-host peer that the kernel verifies, not the peer: after authentication the
// opener connects to a one-shot abstract Unix socket the acceptor announced; each side learns the
// other's pid from SO_PEERCRED, pins it with a pidfd, and receives its memfds with SCM_RIGHTS. Each
// side proves it is the other end of this very link by presenting the random key the other sent
// over the authenticated control connection, and states the two ends of its control connection:
// each accepts the exchange only when the other's are the mirror of its own, so the pid is the
// process at the far end of THIS control connection, not a third process a relaying peer forwarded
// the name and key to. One-sided paths use nothing but these facts.
#ifndef KVBLOCKS_RUNTIME_TRANSPORT_LOCAL_PEER_H_
#define KVBLOCKS_RUNTIME_TRANSPORT_LOCAL_PEER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvblocks {

class PeerBeacon;

struct LocalPeer {
  LocalPeer();
  ~LocalPeer();
  LocalPeer(LocalPeer &&) noexcept;
  LocalPeer &operator=(LocalPeer &&) noexcept;
  int pid = 0;     // from SO_PEERCRED
  int pidfd = -1;  // pins `pid`: readable once that process has exited
  std::map<int64_t, int> memfds;  // cache id -> memfd received with SCM_RIGHTS (owned)
  std::unique_ptr<PeerBeacon> beacon;  // the peer's liveness word (transport/beacon.h), if it sent one
  void TakeBeacon();  // maps memfds[kBeaconId], when present, into `beacon`
  void Release();  // closes the memfds not taken
};

using LocalFds = std::vector<std::pair<int64_t, int>>;  // cache id, our memfd

// The ends of a stream connection over IP as one side sees them: local, then remote, each a 16-byte IPv6
// address (IPv4 mapped into ::ffff:0:0/96) and a big-endian port.
struct ConnEnds {
  uint8_t local[18] = {};
  uint8_t remote[18] = {};
};
// False when `fd` is not a connected stream socket over IPv4/IPv6.
bool ConnEndsOf(int fd, ConnEnds *out);
// `theirs` is the same connection seen from its other end.
bool MirrorsOf(const ConnEnds &theirs, const ConnEnds &mine);

// Acceptor: a fresh listening socket with a random abstract name (returned in `name`), or -1.
int ListenLocal(std::string *name);
// Acceptor: accepts one connection on `lfd`, checks the opener presents `my_key` and the mirror of
// `ctrl` (our control connection's ends), answers with `their_key`, `ctrl` and `mine`. False (and
// nothing learnt, nothing sent) on any mismatch, on a peer that is this process, or when `deadline`
// passes.
bool AcceptLocalExchange(int lfd, const uint8_t my_key[16], const uint8_t their_key[16], const ConnEnds &ctrl,
                         const LocalFds &mine, int64_t deadline, LocalPeer *out);
// Opener: connects to the acceptor's socket (-1 when there is none in this network namespace),
// then the same exchange from the connecting side.
int ConnectLocal(const std::string &name);
bool OpenerLocalExchange(int fd, const uint8_t my_key[16], const uint8_t their_key[16], const ConnEnds &ctrl,
                         const LocalFds &mine, int64_t deadline, LocalPeer *out);

int OpenPidfd(int pid);          // -1 when the kernel has no pidfd_open
bool ProcessExited(int pidfd);   // false for -1

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_TRANSPORT_LOCAL_PEER_H_
