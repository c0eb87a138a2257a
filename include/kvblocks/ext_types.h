// SPDX-License-Identifier: Apache-2.0
// The plain data types of kvblocks' extensions: option keys, enums and structs with no behaviour.
// The runtime's headers (ext.h, async.h, layerwise.h) and the Cython core's CANN-build shim
// (kvblocks/ext_shim.h) both include this one definition, so the two builds cannot drift apart.
#ifndef KVBLOCKS_EXT_TYPES_H_
#define KVBLOCKS_EXT_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "llm_datadist/llm_datadist.h"

namespace kvblocks {

// ABI: these headers (this one and ext.h), unlike llm_datadist.h and hixl/hixl.h, has std::string in signatures and
// structs (NotifyMessage, LinkPath, SendNotify). Those are not converted: instead a client built
// with a different _GLIBCXX_USE_CXX11_ABI than the library (CANN's -D_GLIBCXX_USE_CXX11_ABI=0)
// fails to link to them rather than misreading them. Functions taking or returning std::string
// carry std::__cxx11 / [abi:cxx11] in their symbols already; NotifyMessage is tagged here so that
// GetNotifies(std::vector<NotifyMessage>&) does too. Every other ImplAccess call uses only
// ABI-neutral types and links under either value.
#if defined(__GNUC__) && defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
#define KVBLOCKS_STD_STRING_ABI __attribute__((abi_tag("cxx11")))
#else
#define KVBLOCKS_STD_STRING_ABI
#endif

// kvblocks option keys (documented in the README).
constexpr const char OPTION_TRANSPORT[] = "kvblocks.Transport";     // auto | shm | tcp
constexpr const char OPTION_AUTH_TOKEN[] = "kvblocks.AuthToken";    // shared secret for links
constexpr const char OPTION_ROLE_CHECK[] = "kvblocks.RoleCheck";    // "0" (default, CANN V2) | "1" (V1 roles)
constexpr const char OPTION_MAX_LINKS[] = "kvblocks.MaxLinks";  // links in all (default 512, fewer at a low fd limit)
constexpr const char OPTION_MAX_LINKS_PER_PEER[] = "kvblocks.MaxLinksPerPeer";  // links from one address (default 32)
constexpr const char OPTION_INTEGRITY[] = "kvblocks.Integrity";  // none (default) | crc32c: CRC32C on TCP transfers
constexpr const char OPTION_UCX_TRUSTED_NETWORK[] = "kvblocks.UcxTrustedNetwork";  // "1": UCX (exposes memory)
constexpr const char OPTION_ENCRYPTION[] = "kvblocks.Encryption";      // none (default) | tls: TLS 1.3 on TCP links
constexpr const char OPTION_TLS_CERT_FILE[] = "kvblocks.TlsCertFile";  // PEM chain: TLS by certificates
constexpr const char OPTION_TLS_KEY_FILE[] = "kvblocks.TlsKeyFile";    // PEM private key of TlsCertFile
constexpr const char OPTION_TLS_CA_FILE[] = "kvblocks.TlsCaFile";      // PEM CA that signs every peer's certificate

// Why a LinkLlmClusters (or hixl Connect) to one cluster failed, kept per cluster until the next
// attempt to link to it (ImplAccess::LastLinkFailure). kAuthRefused also covers a listener that is
// another cluster than asked for when both sides set kvblocks.AuthToken: its proof names its own
// cluster id, so the two cannot be told apart before it has proven anything.
enum class LinkFailureReason : uint8_t {
  kNone = 0,
  kRefused = 1,          // nothing listens there (ECONNREFUSED)
  kUnreachable = 2,      // no route to the host or network (EHOSTUNREACH, ENETUNREACH, ...)
  kTimedOut = 3,         // no answer before the link timeout
  kAuthRefused = 4,      // kvblocks.AuthToken: missing, another token, or a proof for another listener
  kWrongClusterId = 5,   // the listener is another cluster than remote_cluster_id
  kVersionMismatch = 6,  // the listener refused our HELLO: another kvblocks protocol version
  kLimitExceeded = 7,    // kvblocks.MaxLinks / MaxLinksPerPeer, here or at the peer
  kAlreadyLinked = 8,    // the peer holds a live link with us
  kOther = 9,            // anything else: the message says what
};

struct KVBLOCKS_STD_STRING_ABI LinkFailure {
  LinkFailureReason reason = LinkFailureReason::kNone;
  llm_datadist::Status status = 0;  // the status LinkLlmClusters returned for that cluster
  std::string message;              // what LastErrorMessage() said then
};

// How a cache may be addressed: kMix (C++ RegisterKvCache/AllocateCache) serves both block and
// batch transfers; kBlocks and kCache mirror CANN's Python register_blocks_cache/register_cache.
enum class CacheKind : uint8_t { kMix = 0, kBlocks = 1, kCache = 2 };

// Data path of a link, as chosen at link time.
enum class PathKind : uint8_t { kNone = 0, kInProcess = 1, kSharedMemory = 2, kTcp = 3 };

// A notification received from a peer (SendNotify / GetNotifies).
struct KVBLOCKS_STD_STRING_ABI NotifyMessage {
  uint64_t from_cluster_id = 0;
  std::string name;
  std::string message;
};

// One address-based copy: `len` bytes between local address `local` and the peer's address
// `remote` (read: remote -> local; write: local -> remote). Both must lie in registered memory.
struct AddrRange {
  uint64_t local = 0, remote = 0, len = 0;
};

// A peer's cache as announced in its link-time table (what CANN's remote-accessible mode reads).
struct RemoteCacheInfo {
  int64_t cache_id = 0;
  int64_t key = -1;
  bool allocated = false;  // allocated by the peer's runtime (not user memory it registered)
  std::vector<int64_t> batch_keys;
  uint32_t num_tensors = 0;
  uint64_t tensor_bytes = 0, num_blocks = 0, batch_size = 0, stride = 0;
  std::vector<uint64_t> addrs;
};

// One request of a batch: the arguments of PullKvBlocks (pull = true: `remote` is the source and
// `local` the destination) or of PushKvBlocks (pull = false: `local` is the source).
struct BlocksRequest {
  bool pull = true;
  llm_datadist::CacheIndex remote;
  llm_datadist::Cache local;
  std::vector<uint64_t> src_blocks;
  std::vector<uint64_t> dst_blocks;
  llm_datadist::KvCacheExtParam ext;
};

// A byte range of one tensor pair in a piece of a layer push (offsets: see LayerPiece).
struct LayerSegment {
  uint64_t src_off = 0, dst_off = 0, len = 0;
};

// One part of a layer (CANN's transfer_cache_async): bytes of local tensor `src_tensor` to one
// remote tensor, named either by (dst_cache_id > 0, dst_tensor), with dst_off from the tensor's
// start, or by an address `dst_addr` inside a tensor the peer registered (dst_cache_id <= 0), with
// dst_off from that address. Every piece is checked against both cache tables at the open.
struct LayerPiece {
  uint32_t layer = 0;
  uint32_t src_tensor = 0;
  int64_t dst_cache_id = 0;
  uint32_t dst_tensor = 0;
  uint64_t dst_addr = 0;
  std::vector<LayerSegment> segs;
};

}  // namespace kvblocks

#endif  // KVBLOCKS_EXT_TYPES_H_
