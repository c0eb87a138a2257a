// SPDX-License-Identifier: Apache-2.0
// Every limit and magic number of the runtime, in one place. Each says why it has its value.
#ifndef KVBLOCKS_RUNTIME_COMMON_LIMITS_H_
#define KVBLOCKS_RUNTIME_COMMON_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace kvblocks {

constexpr int64_t kMsNs = 1000000LL;
constexpr int64_t kSecNs = 1000LL * kMsNs;

// ---- wire
constexpr uint32_t kMagic = 0x3142564BU;  // "KVB1" little-endian
// 2: capability bitmask and per-transport table descriptors. 3: fixed-size HELLO; identity, tables
// and link tokens only after mutual authentication; verified same-process/same-host paths. 4: data
// of READ_RESP and inline WRITE_REQ frames padded to a 64-byte offset (wire/messages.h). 5: proofs
// and BIND cover the whole handshake transcript (kind, both cluster ids, the listener's address).
constexpr uint32_t kProtocolVersion = 5;
// Payload bounds per frame type: wire/messages.h kPayloadLimits. The two large ones: LINK_INFO (a
// cache table of up to kMaxLinkCaches entries) and a data request (its byte ranges).
constexpr uint64_t kMaxLinkInfoPayload = 64ULL << 20;
constexpr uint64_t kMaxRequestPayload = 64ULL << 20;
// A payload buffer starts at this size and then at most doubles per read, so it never holds more
// than twice the bytes that arrived (plus this): announcing a length costs the listener nothing.
constexpr uint64_t kPayloadChunk = 64ULL << 10;
// A CACHE_INFO payload: cache id, count and one table entry. An honest one is at most 16 MiB and a
// little: kMaxTableTensors addresses and as many batch keys (8 bytes each), plus fixed fields.
constexpr uint64_t kMaxCacheInfoPayload = (16ULL << 20) + 4096;
// Caches a link keeps of those the peer registered after linking (CACHE_QUERY): a peer that
// allocates a cache per request would otherwise grow the link without bound. One forgotten costs
// a round trip when it is used again.
constexpr size_t kMaxLateCaches = 4096;
constexpr uint64_t kRequestFixedBytes = 40;  // an encoded XferRequest: fixed fields,
constexpr uint64_t kRequestRangeBytes = 16;  // plus 4 bytes a tensor and 16 a byte range
constexpr uint64_t kMaxInlineWrite = 256ULL << 10;    // pushes this small skip the READY round trip
constexpr size_t kMaxLocalName = 64;                  // abstract Unix socket name in LINK_INFO
constexpr size_t kMaxLocalFds = 250;                  // memfds passed in one SCM_RIGHTS message (kernel: 253)
// A link's cache table, as the peer announced it at link time: at most kMaxLinkCaches entries and
// kMaxLinkTableBytes of decoded state (TableFootprint: kTableEntryBytes an entry, for the entry, its
// liveness record and map node, plus its addresses and keys). An entry is at least 55
// bytes on the wire, so the state is at most ~14x the bytes received (16,384 minimal entries: 0.9 MiB
// sent, 12 MiB held), and at most 32 MiB a link;
// caches learned later (CACHE_QUERY) have a budget of their own of the same size.
constexpr uint32_t kMaxLinkCaches = 16384;
constexpr uint64_t kTableEntryBytes = 768;  // measured: ~760 bytes of RSS an entry
constexpr uint64_t kMaxLinkTableBytes = 32ULL << 20;
constexpr uint32_t kMaxTableTensors = 1U << 20;

// ---- links and handshakes
constexpr int64_t kHandshakeNs = 10 * kSecNs;  // bound on an authenticated peer that stalls mid-handshake
// Before authentication a connection gets kAuthNs to finish HELLO..AUTH (a few hundred bytes), and
// holds one of kMaxHandshakes slots; when they are all taken the oldest is dropped, so slow sockets
// delay a real handshake by at most kAuthNs and never refuse it.
constexpr int64_t kAuthNs = 2 * kSecNs;
constexpr size_t kMaxHandshakes = 64;
constexpr int kMaxRequesterChannels = 8;       // data channels per link and direction; more are refused
// Links (kvblocks.MaxLinks, kvblocks.MaxLinksPerPeer): each holds a thread and 3 to 17 fds on
// both sides, so an authenticated peer may not open them without bound. The total defaults to
// kDefaultMaxLinks, or RLIMIT_NOFILE / kFdsPerLink when that is lower, so links alone never use
// up the process's fds; one peer address may hold kDefaultMaxLinksPerPeer (a host may run an
// engine per device, and each may link).
constexpr size_t kDefaultMaxLinks = 512;
constexpr size_t kDefaultMaxLinksPerPeer = 32;
constexpr size_t kFdsPerLink = 8;
constexpr int64_t kReverseRetryNs = 5 * kMsNs; // after a refused OPEN_REVERSE, wait before asking again
constexpr int64_t kErrorReplyNs = 100 * kMsNs; // best-effort ERROR frames before closing

// ---- serving
constexpr int64_t kFrameNs = 10 * kSecNs;     // a started frame must arrive within this
constexpr int64_t kDeadlineSlackNs = 5 * kMsNs;  // clock-offset error tolerated at a deadline
constexpr int64_t kMaxServeNs = 600 * kSecNs; // no request holds a serving thread longer

// ---- streams
// A receive of at least kLowatMinBytes asks the kernel to wake it only once kRecvLowatBytes have
// arrived (SO_RCVLOWAT): fewer wake-ups and fuller recvmsg calls, +10-20 % on a loopback link.
constexpr uint64_t kRecvLowatBytes = 2ULL << 20;
constexpr uint64_t kLowatMinBytes = 2 * kRecvLowatBytes;
// One sendmsg/recvmsg moves at most this much. The kernel pushes a write's segments and the reader
// sends its window update only when the call ends, so a 64 MiB call leaves the other end idle:
// 1 MiB calls took 256 MiB of random 64 KiB blocks over loopback 1.4-1.6x faster than 64 MiB ones.
constexpr uint64_t kSocketCallBytes = 1ULL << 20;
// An encrypted transfer at least this large is striped over channels, one per copy thread and the
// caller's (tcp_path.cc); it is the copy pool's own threshold (kParallelBytes, below). TLS pulls over
// loopback, 2 cores, median of 7: 2 MiB 2.50 -> 1.49 ms, 8 MiB 9.77 -> 5.70 ms, 15 MiB 16.5 -> 11.5 ms.
constexpr uint64_t kStripeMinBytes = 2ULL << 20;

// ---- copies
// Large one-sided copies are split over a few threads: one core cannot saturate memory bandwidth
// with 64 KiB copies on this kind of machine. Small ones stay on the caller's thread.
constexpr uint64_t kParallelBytes = 2ULL << 20;
// One-sided copies look at the clock after every this many bytes (about 0.1-0.3 ms of memcpy), so a
// deadline is kept to within one chunk however the plan is shaped.
constexpr uint64_t kDeadlineCheckBytes = 1ULL << 20;
constexpr size_t kMaxCopyThreads = 4;  // the caller plus up to 3 copy-pool threads
constexpr int64_t kPoolSpinNs = 100 * 1000;  // a copy thread's watch for the next job

// ---- asynchronous transfers
// Worker threads executing submitted transfers, started as needed: enough to keep the channel pool
// of two links on the served path busy (kMaxRequesterChannels each); same-host copies share them.
constexpr size_t kMaxAsyncThreads = 2 * kMaxRequesterChannels;
// One idle worker polls the queue this long before sleeping, so a burst of submissions costs no
// wake-up system call each (a futex wake is 1-5 us on a loaded machine; a submission ~1 us).
constexpr int64_t kAsyncSpinUs = 50;
// A queued job wakes no worker while fewer jobs are queued than workers busy with one-sided copies
// up to this size (tens of microseconds at most): one of them takes it sooner than a woken thread.
constexpr uint64_t kBriefCopyBytes = 1ULL << 20;
// A single submitted one-sided copy up to this size runs on the submitting thread: a memcpy or
// process_vm_readv of 16 KiB (about 1 us) costs less than waking a worker to do it (2-5 us).
constexpr uint64_t kInlineCopyBytes = 16ULL << 10;

// ---- notifications (send_notify / get_notifies, as CANN hixl defines them)
constexpr size_t kMaxNotifyName = 1024;     // bytes (UTF-8) of a notification's name: hixl's limit
constexpr size_t kMaxNotifyMessage = 1024;  // bytes of its message
// Undelivered notifications an engine queues, from all peers together (hixl counts per engine).
// Past it a NOTIFY is refused with LLM_LINK_BUSY and nothing is queued, so a peer flooding us
// holds at most kMaxQueuedNotifies x (kMaxNotifyName + kMaxNotifyMessage) bytes, about 8 MiB.
constexpr size_t kMaxQueuedNotifies = 4096;

// ---- address-based transfers (hixl)
// hixl's transfer_async has no timeout of its own: the caller polls and disconnects when it deems
// a request late. The runtime still bounds how long a request may hold a link and its memory.
constexpr int64_t kRangesAsyncDeadlineNs = 30 * kSecNs;

// ---- defaults
constexpr int64_t kDefaultWaitMs = 1000;  // llm.SyncKvCacheWaitTime
constexpr int64_t kDefaultSpinUs = 50;    // KVBLOCKS_SPIN_US
// A thread whose read spin was preempted (the cores are busy with other work) waits in poll()
// without spinning for a while, then tries spinning again: kSpinBackoffMinNs after the first
// preempted spin, doubling with each further one up to kSpinBackoffNs.
constexpr int64_t kSpinBackoffMinNs = 1 * kMsNs;
constexpr int64_t kSpinBackoffNs = 100 * kMsNs;

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_COMMON_LIMITS_H_
