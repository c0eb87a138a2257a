// SPDX-License-Identifier: Apache-2.0
// TLS 1.3 through a dlopen()ed OpenSSL 3 (net/tls.h). Only the few functions and constants
// used here are declared, with OpenSSL 3's stable ABI; no OpenSSL header is needed to build.
#include "net/tls.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/error.h"
#include "common/limits.h"
#include "common/util.h"
#include "security/auth.h"

namespace kvblocks {

using namespace llm_datadist;  // NOLINT: status constants

namespace {

// ---- the OpenSSL 3 ABI used here (ssl.h, bio.h, prov_ssl.h)
constexpr int kErrWantRead = 2, kErrWantWrite = 3, kErrSyscall = 5, kErrZeroReturn = 6;
constexpr int kCtrlMode = 33, kCtrlSetReadAhead = 41, kCtrlSetMinProto = 123, kCtrlSetMaxProto = 124;
constexpr int kCtrlGetNegotiatedGroup = 134;
constexpr int kBioCtrlGetKtlsSend = 73, kBioCtrlGetKtlsRecv = 76;
constexpr long kTls13 = 0x0304;
constexpr uint64_t kOpEnableKtls = 1ULL << 3, kOpIgnoreUnexpectedEof = 1ULL << 7, kOpNoTicket = 1ULL << 14;
constexpr long kModeAcceptMovingWriteBuffer = 0x2;
constexpr int kVerifyPeer = 1, kVerifyFailIfNoPeerCert = 2, kFiletypePem = 1;

using UseSessionCb = int (*)(void *ssl, const void *md, const unsigned char **id, size_t *idlen, void **sess);
using FindSessionCb = int (*)(void *ssl, const unsigned char *id, size_t idlen, void **sess);

struct Api {
  const void *(*TLS_method)();
  void *(*SSL_CTX_new)(const void *);
  void (*SSL_CTX_free)(void *);
  uint64_t (*SSL_CTX_set_options)(void *, uint64_t);
  long (*SSL_CTX_ctrl)(void *, int, long, void *);
  int (*SSL_CTX_set_ciphersuites)(void *, const char *);
  void (*SSL_CTX_set_psk_use_session_callback)(void *, UseSessionCb);
  void (*SSL_CTX_set_psk_find_session_callback)(void *, FindSessionCb);
  int (*SSL_CTX_set_num_tickets)(void *, size_t);
  void (*SSL_CTX_set_default_read_buffer_len)(void *, size_t);
  int (*SSL_CTX_use_certificate_chain_file)(void *, const char *);
  int (*SSL_CTX_use_PrivateKey_file)(void *, const char *, int);
  int (*SSL_CTX_check_private_key)(const void *);
  int (*SSL_CTX_load_verify_locations)(void *, const char *, const char *);
  void (*SSL_CTX_set_verify)(void *, int, void *);
  void *(*SSL_new)(void *);
  void (*SSL_free)(void *);
  int (*SSL_set_fd)(void *, int);
  int (*SSL_connect)(void *);
  int (*SSL_accept)(void *);
  int (*SSL_read)(void *, void *, int);
  int (*SSL_write)(void *, const void *, int);
  int (*SSL_get_error)(const void *, int);
  int (*SSL_has_pending)(const void *);
  int (*SSL_shutdown)(void *);
  long (*SSL_ctrl)(void *, int, long, void *);
  int (*SSL_set_ex_data)(void *, int, void *);
  void *(*SSL_get_ex_data)(const void *, int);
  int (*SSL_export_keying_material)(void *, unsigned char *, size_t, const char *, size_t, const unsigned char *,
                                    size_t, int);
  void *(*SSL_SESSION_new)();
  void (*SSL_SESSION_free)(void *);
  int (*SSL_SESSION_set1_master_key)(void *, const unsigned char *, size_t);
  int (*SSL_SESSION_set_cipher)(void *, const void *);
  int (*SSL_SESSION_set_protocol_version)(void *, int);
  const void *(*SSL_CIPHER_find)(void *, const unsigned char *);
  const void *(*SSL_get_current_cipher)(const void *);
  const char *(*SSL_CIPHER_get_name)(const void *);
  void *(*SSL_get_rbio)(const void *);
  void *(*SSL_get_wbio)(const void *);
  long (*BIO_ctrl)(void *, int, long, void *);
  unsigned long (*ERR_get_error)();
  void (*ERR_error_string_n)(unsigned long, char *, size_t);
  void (*ERR_clear_error)();
};

// Loads libssl once; nullptr (with the reason in *why) when it is absent or too old.
const Api *LoadApi(std::string *why) {
  static std::string error;
  static const Api *api = [] () -> const Api * {
    const char *env = getenv("KVBLOCKS_LIBSSL");  // another libssl.so.3 (tests: one that is absent)
    const std::string ssl_name = env != nullptr && *env != '\0' ? env : "libssl.so.3";
    void *ssl = dlopen(ssl_name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (ssl == nullptr) {
      error = "cannot load " + ssl_name + " (OpenSSL 3): " + dlerror() + "; install OpenSSL 3 (libssl3)";
      return nullptr;
    }
    static Api a;
    bool ok = true;
    auto sym = [&](const char *name, auto *fn) {
      void *p = dlsym(ssl, name);  // libssl's own symbols and its libcrypto's
      if (p == nullptr && ok) error = ssl_name + " lacks " + name + " (OpenSSL 3 is needed)";
      ok = ok && p != nullptr;
      *reinterpret_cast<void **>(fn) = p;
    };
#define KVB_SYM(n) sym(#n, &a.n)
    KVB_SYM(TLS_method); KVB_SYM(SSL_CTX_new); KVB_SYM(SSL_CTX_free); KVB_SYM(SSL_CTX_set_options);
    KVB_SYM(SSL_CTX_ctrl); KVB_SYM(SSL_CTX_set_ciphersuites); KVB_SYM(SSL_CTX_set_psk_use_session_callback);
    KVB_SYM(SSL_CTX_set_psk_find_session_callback); KVB_SYM(SSL_CTX_set_num_tickets);
    KVB_SYM(SSL_CTX_set_default_read_buffer_len); KVB_SYM(SSL_CTX_use_certificate_chain_file);
    KVB_SYM(SSL_CTX_use_PrivateKey_file); KVB_SYM(SSL_CTX_check_private_key); KVB_SYM(SSL_CTX_load_verify_locations);
    KVB_SYM(SSL_CTX_set_verify); KVB_SYM(SSL_new); KVB_SYM(SSL_free); KVB_SYM(SSL_set_fd); KVB_SYM(SSL_connect);
    KVB_SYM(SSL_accept); KVB_SYM(SSL_read); KVB_SYM(SSL_write); KVB_SYM(SSL_get_error); KVB_SYM(SSL_has_pending);
    KVB_SYM(SSL_shutdown); KVB_SYM(SSL_ctrl); KVB_SYM(SSL_set_ex_data); KVB_SYM(SSL_get_ex_data);
    KVB_SYM(SSL_export_keying_material); KVB_SYM(SSL_SESSION_new); KVB_SYM(SSL_SESSION_free);
    KVB_SYM(SSL_SESSION_set1_master_key); KVB_SYM(SSL_SESSION_set_cipher); KVB_SYM(SSL_SESSION_set_protocol_version);
    KVB_SYM(SSL_CIPHER_find); KVB_SYM(SSL_get_current_cipher); KVB_SYM(SSL_CIPHER_get_name); KVB_SYM(SSL_get_rbio);
    KVB_SYM(SSL_get_wbio); KVB_SYM(BIO_ctrl); KVB_SYM(ERR_get_error); KVB_SYM(ERR_error_string_n);
    KVB_SYM(ERR_clear_error);
#undef KVB_SYM
    return ok ? &a : nullptr;
  }();
  if (api == nullptr && why != nullptr) *why = error;
  return api;
}

const Api &A() { return *LoadApi(nullptr); }  // only once a context exists

// OpenSSL's oldest queued error, as text ("" when none).
std::string ErrText() {
  const unsigned long e = A().ERR_get_error();
  if (e == 0) return "";
  char buf[256];
  A().ERR_error_string_n(e, buf, sizeof(buf));
  A().ERR_clear_error();
  return buf;
}

constexpr char kPskIdentity[] = "kvblocks-psk-v1";
constexpr char kPskLabel[] = "kvblocks-tls13-psk-v1";
constexpr char kProofInTlsLabel[] = "kvblocks-tls13-proof-v1";
constexpr char kExporterLabel[] = "EXPORTER-kvblocks-handshake";
const unsigned char kAes128GcmSha256[2] = {0x13, 0x01};

}  // namespace

class TlsContext {
 public:
  ~TlsContext() {
    if (ctx != nullptr) A().SSL_CTX_free(ctx);
  }
  void *ctx = nullptr;
  bool psk = false;
  uint8_t key[32] = {};  // the PSK: HMAC-SHA256(token, label)
  std::atomic<bool> ktls_logged{false};
};

namespace {

// A fresh session carrying the PSK (OpenSSL takes ownership of it).
void *PskSession(void *ssl) {
  auto *c = static_cast<TlsContext *>(A().SSL_get_ex_data(ssl, 0));
  const void *cipher = A().SSL_CIPHER_find(ssl, kAes128GcmSha256);
  void *s = A().SSL_SESSION_new();
  if (c == nullptr || cipher == nullptr || s == nullptr) {
    if (s != nullptr) A().SSL_SESSION_free(s);
    return nullptr;
  }
  if (!A().SSL_SESSION_set1_master_key(s, c->key, sizeof(c->key)) || !A().SSL_SESSION_set_cipher(s, cipher) ||
      !A().SSL_SESSION_set_protocol_version(s, static_cast<int>(kTls13))) {
    A().SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

extern "C" int UsePsk(void *ssl, const void *, const unsigned char **id, size_t *idlen, void **sess) {
  *sess = PskSession(ssl);
  *id = reinterpret_cast<const unsigned char *>(kPskIdentity);
  *idlen = sizeof(kPskIdentity) - 1;
  return *sess != nullptr;
}

extern "C" int FindPsk(void *ssl, const unsigned char *id, size_t idlen, void **sess) {
  // Another identity: no PSK, so the handshake fails (no certificate is configured).
  const bool ours = idlen == sizeof(kPskIdentity) - 1 && memcmp(id, kPskIdentity, idlen) == 0;
  *sess = ours ? PskSession(ssl) : nullptr;
  return !ours || *sess != nullptr;
}

bool LoadCerts(void *ctx, const TlsConfig &cfg, std::string *why) {
  const Api &a = A();
  if (a.SSL_CTX_use_certificate_chain_file(ctx, cfg.cert.c_str()) != 1) {
    *why = "kvblocks.TlsCertFile \"" + cfg.cert + "\": " + ErrText();
    return false;
  }
  if (a.SSL_CTX_use_PrivateKey_file(ctx, cfg.key.c_str(), kFiletypePem) != 1 || a.SSL_CTX_check_private_key(ctx) != 1) {
    *why = "kvblocks.TlsKeyFile \"" + cfg.key + "\": " + ErrText();
    return false;
  }
  if (a.SSL_CTX_load_verify_locations(ctx, cfg.ca.c_str(), nullptr) != 1) {
    *why = "kvblocks.TlsCaFile \"" + cfg.ca + "\": " + ErrText();
    return false;
  }
  // Both sides present a certificate of the CA; peers are addressed by IP, so no name is checked.
  a.SSL_CTX_set_verify(ctx, kVerifyPeer | kVerifyFailIfNoPeerCert, nullptr);
  return true;
}

}  // namespace

std::shared_ptr<TlsContext> MakeTlsContext(const TlsConfig &cfg, std::string *why) {
  const Api *api = LoadApi(why);
  if (api == nullptr) return nullptr;
  auto c = std::make_shared<TlsContext>();
  c->ctx = api->SSL_CTX_new(api->TLS_method());
  if (c->ctx == nullptr) {
    *why = "SSL_CTX_new: " + ErrText();
    return nullptr;
  }
  void *ctx = c->ctx;
  api->SSL_CTX_ctrl(ctx, kCtrlSetMinProto, kTls13, nullptr);
  api->SSL_CTX_ctrl(ctx, kCtrlSetMaxProto, kTls13, nullptr);
  // No resumption tickets (nothing to resume; and kTLS receive cannot take post-handshake records).
  // A peer that closes without close_notify is a plain close here: every frame carries its length,
  // so a connection cut short mid-frame still fails as one.
  api->SSL_CTX_set_options(ctx, kOpNoTicket | kOpEnableKtls | kOpIgnoreUnexpectedEof);
  api->SSL_CTX_set_num_tickets(ctx, 0);
  api->SSL_CTX_ctrl(ctx, kCtrlMode, kModeAcceptMovingWriteBuffer, nullptr);
  // Read ahead into a buffer of several records: one recv() for many, not two for each.
  api->SSL_CTX_ctrl(ctx, kCtrlSetReadAhead, 1, nullptr);
  api->SSL_CTX_set_default_read_buffer_len(ctx, kTlsReadAheadBytes);
  const bool certs = !cfg.cert.empty() || !cfg.key.empty() || !cfg.ca.empty();
  if (certs) {
    if (cfg.cert.empty() || cfg.key.empty() || cfg.ca.empty()) {
      *why = "certificate mode needs all of kvblocks.TlsCertFile, kvblocks.TlsKeyFile and kvblocks.TlsCaFile";
      return nullptr;
    }
    if (!LoadCerts(ctx, cfg, why)) return nullptr;
    return c;
  }
  if (cfg.token.empty()) {
    *why = "kvblocks.Encryption=tls needs kvblocks.AuthToken (the pre-shared key) or certificates "
           "(kvblocks.TlsCertFile, kvblocks.TlsKeyFile, kvblocks.TlsCaFile)";
    return nullptr;
  }
  c->psk = true;
  HmacSha256(reinterpret_cast<const uint8_t *>(cfg.token.data()), cfg.token.size(),
             reinterpret_cast<const uint8_t *>(kPskLabel), sizeof(kPskLabel) - 1, c->key);
  // The PSK's hash is SHA-256, so its suite; the (EC)DHE share (psk_dhe_ke) is OpenSSL's default.
  if (api->SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") != 1) {
    *why = "TLS_AES_128_GCM_SHA256: " + ErrText();
    return nullptr;
  }
  api->SSL_CTX_set_psk_use_session_callback(ctx, UsePsk);
  api->SSL_CTX_set_psk_find_session_callback(ctx, FindPsk);
  return c;
}

// ------------------------------------------------------------------ sessions by fd
struct TlsConn {
  void *ssl = nullptr;
  std::mutex mu;  // one SSL call at a time: the control connection is read and written by two threads
  bool ktls_send = false, ktls_recv = false;
  // A write that SSL_write asked to repeat: it must be repeated with the same bytes.
  const uint8_t *pend = nullptr;
  size_t pend_len = 0;
  uint8_t stage[16384];  // small iovecs gathered into one record
};

namespace {
constexpr int kMaxTlsFds = 1 << 20;
std::atomic<std::atomic<TlsConn *> *> g_conns{nullptr};
std::mutex g_conns_mu;

std::atomic<TlsConn *> *Table() {
  std::atomic<TlsConn *> *t = g_conns.load(std::memory_order_acquire);
  if (t != nullptr) return t;
  std::lock_guard<std::mutex> g(g_conns_mu);
  t = g_conns.load();
  if (t == nullptr) {
    // calloc: untouched pages cost nothing; atomics of pointers are plain words.
    t = static_cast<std::atomic<TlsConn *> *>(calloc(kMaxTlsFds, sizeof(std::atomic<TlsConn *>)));
    g_conns.store(t, std::memory_order_release);
  }
  return t;
}

void FreeConn(TlsConn *c) {
  if (c == nullptr) return;
  A().SSL_free(c->ssl);
  delete c;
}

// Waits for `events` on fd until the deadline; false on timeout or a poll failure.
bool WaitUntil(int fd, short events, int64_t deadline) {
  for (;;) {
    const int64_t left = deadline - NowNs();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, INT_MAX)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

// Why a handshake failed, for the user: OpenSSL's reason and what it usually means here.
// *closed: the peer closed the connection without a word (a listener under a connect flood drops
// unauthenticated connections so; the opener may try again).
std::string HandshakeWhy(TlsContext *ctx, int err, bool *closed) {
  std::string e = ErrText();
  *closed = e.empty() && (err == kErrSyscall || err == kErrZeroReturn);
  if (e.empty()) e = *closed ? "the peer closed the connection" : "no detail";
  std::string hint = ctx->psk ? "the peer does not use kvblocks.Encryption=tls or uses another kvblocks.AuthToken"
                              : "the peer does not use kvblocks.Encryption=tls or has no certificate of our CA";
  return e + " (" + hint + ")";
}

// A listener's answer to an opener without kvblocks.Encryption=tls, whose first bytes are a kvblocks
// frame: OpenSSL would close without a word, which the opener takes for a dropped handshake and
// retries. A TLS alert record (fatal, protocol_version) tells it why (handshake.cc).
bool RefusePlainOpener(int fd, int64_t deadline, const std::string &peer) {
  uint8_t head[4];
  if (!WaitUntil(fd, POLLIN, deadline) || recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT) != 4) return false;
  const uint32_t magic = head[0] | head[1] << 8 | head[2] << 16 | static_cast<uint32_t>(head[3]) << 24;
  if (magic != kMagic) return false;
  static const uint8_t kAlert[7] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46};
  (void)!send(fd, kAlert, sizeof(kAlert), MSG_NOSIGNAL | MSG_DONTWAIT);
  LogWarn("refused a link from %s: it does not use kvblocks.Encryption=tls, and this engine does", peer.c_str());
  return true;
}

void NoteKtls(TlsContext *ctx, const TlsConn *c) {
  if (ctx->ktls_logged.exchange(true)) return;
  const char *rest = c->ktls_send && c->ktls_recv    ? ""
                     : c->ktls_send || c->ktls_recv ? " (OpenSSL does the other direction in user space)"
                                                    : " (OpenSSL encrypts and decrypts in user space)";
  LogInfo("TLS 1.3: kernel TLS offload %s for sending, %s for receiving%s", c->ktls_send ? "on" : "off",
          c->ktls_recv ? "on" : "off", rest);
}
}  // namespace

Status TlsStart(TlsContext *ctx, int fd, bool client, int64_t deadline, const std::string &peer, bool *dropped) {
  if (dropped != nullptr) *dropped = false;
  const Api &a = A();
  if (fd < 0 || fd >= kMaxTlsFds) return Fail(LLM_LINK_FAILED, "TLS: fd %d out of range", fd);
  if (!client && RefusePlainOpener(fd, deadline, peer))
    return Fail(LLM_LINK_FAILED, "%s does not use kvblocks.Encryption=tls", peer.c_str());
  auto *c = new TlsConn();
  c->ssl = a.SSL_new(ctx->ctx);
  if (c->ssl == nullptr || a.SSL_set_fd(c->ssl, fd) != 1) {
    const std::string e = ErrText();
    FreeConn(c);  // SSL_free(NULL) does nothing
    return Fail(LLM_LINK_FAILED, "TLS with %s: %s", peer.c_str(), e.c_str());
  }
  a.SSL_set_ex_data(c->ssl, 0, ctx);
  a.ERR_clear_error();
  for (;;) {
    const int rc = client ? a.SSL_connect(c->ssl) : a.SSL_accept(c->ssl);
    if (rc == 1) break;
    const int err = a.SSL_get_error(c->ssl, rc);
    if (err == kErrWantRead || err == kErrWantWrite) {
      if (WaitUntil(fd, err == kErrWantRead ? POLLIN : POLLOUT, deadline)) continue;
      FreeConn(c);
      NoteLinkReason(LinkFailureReason::kTimedOut);
      return Fail(LLM_TIMEOUT, "TLS handshake with %s timed out", peer.c_str());
    }
    bool closed = false;
    const std::string why = HandshakeWhy(ctx, err, &closed);
    FreeConn(c);
    if (dropped != nullptr) *dropped = closed;
    if (closed && dropped != nullptr) return Fail(LLM_LINK_FAILED, "TLS handshake with %s: closed", peer.c_str());
    LogWarn("TLS handshake with %s failed: %s", peer.c_str(), why.c_str());
    NoteLinkReason(LinkFailureReason::kAuthRefused);  // no TLS there, another token, or another CA
    return Fail(LLM_LINK_FAILED, "TLS handshake with %s failed: %s", peer.c_str(), why.c_str());
  }
  // Forward secrecy: the PSK alone (psk_ke) would let the token decrypt recorded traffic later.
  if (a.SSL_ctrl(c->ssl, kCtrlGetNegotiatedGroup, 0, nullptr) == 0) {
    FreeConn(c);
    return Fail(LLM_LINK_FAILED, "TLS with %s: no ephemeral key exchange was negotiated", peer.c_str());
  }
  c->ktls_send = a.BIO_ctrl(a.SSL_get_wbio(c->ssl), kBioCtrlGetKtlsSend, 0, nullptr) != 0;
  c->ktls_recv = a.BIO_ctrl(a.SSL_get_rbio(c->ssl), kBioCtrlGetKtlsRecv, 0, nullptr) != 0;
  NoteKtls(ctx, c);
  FreeConn(Table()[fd].exchange(c, std::memory_order_acq_rel));  // a stale one cannot be left, but never leak
  return LLM_SUCCESS;
}

TlsConn *TlsOf(int fd) {
  std::atomic<TlsConn *> *t = g_conns.load(std::memory_order_acquire);
  if (t == nullptr || fd < 0 || fd >= kMaxTlsFds) return nullptr;
  return t[fd].load(std::memory_order_acquire);
}

void CloseConn(int fd) {
  std::atomic<TlsConn *> *t = g_conns.load(std::memory_order_acquire);
  if (t != nullptr && fd >= 0 && fd < kMaxTlsFds) {
    TlsConn *c = t[fd].exchange(nullptr, std::memory_order_acq_rel);
    if (c != nullptr) {
      A().SSL_shutdown(c->ssl);  // close_notify, best effort (non-blocking)
      FreeConn(c);
    }
  }
  close(fd);
}

std::string ProofKey(int fd, const std::string &token) {
  TlsConn *c = TlsOf(fd);
  if (c == nullptr || token.empty()) return token;
  uint8_t ekm[32], key[32];
  {
    std::lock_guard<std::mutex> g(c->mu);
    if (A().SSL_export_keying_material(c->ssl, ekm, sizeof(ekm), kExporterLabel, sizeof(kExporterLabel) - 1, nullptr,
                                       0, 0) != 1)
      return std::string();  // cannot happen after a TLS 1.3 handshake; an empty key fails the proofs
  }
  std::string msg(kProofInTlsLabel, sizeof(kProofInTlsLabel) - 1);
  msg.append(reinterpret_cast<const char *>(ekm), sizeof(ekm));
  HmacSha256(reinterpret_cast<const uint8_t *>(token.data()), token.size(),
             reinterpret_cast<const uint8_t *>(msg.data()), msg.size(), key);
  return std::string(reinterpret_cast<const char *>(key), sizeof(key));
}

bool TlsKernel(const TlsConn *c, bool send) { return send ? c->ktls_send : c->ktls_recv; }

bool TlsBuffered(TlsConn *c) {
  std::lock_guard<std::mutex> g(c->mu);
  return A().SSL_has_pending(c->ssl) != 0;
}

namespace {
// -1 with errno for a failed SSL call (EAGAIN and *events for one to repeat).
ssize_t SslFailed(TlsConn *c, int rc, short *events) {
  const int err = A().SSL_get_error(c->ssl, rc);
  if (err == kErrWantRead || err == kErrWantWrite) {
    *events = err == kErrWantRead ? POLLIN : POLLOUT;
    errno = EAGAIN;
    return -1;
  }
  if (err == kErrZeroReturn) return 0;  // close_notify
  const int sys = errno;
  const std::string e = ErrText();
  if (err == kErrSyscall && e.empty()) {
    if (sys == 0) return 0;  // the peer closed without close_notify
    errno = sys;
    return -1;
  }
  // A record that fails authentication ("bad record mac", "decryption failed"): altered in flight.
  LogWarn("TLS: %s; the connection is dropped", e.empty() ? "protocol error" : e.c_str());
  errno = EPROTO;
  return -1;
}
}  // namespace

ssize_t TlsRecv(TlsConn *c, void *p, size_t n, short *events) {
  std::lock_guard<std::mutex> g(c->mu);
  errno = 0;
  A().ERR_clear_error();
  const int rc = A().SSL_read(c->ssl, p, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  return rc > 0 ? rc : SslFailed(c, rc, events);
}

// Large iovecs go to SSL_write as they are (OpenSSL cuts them into 16 KiB records, encrypting from
// the caller's memory into its record buffer); runs of smaller ones (4 KiB blocks, frame headers) are
// gathered into full records: a record costs a write() and, at the reader, often a wake-up.
ssize_t TlsSendv(TlsConn *c, const struct iovec *iov, size_t iovcnt, short *events) {
  constexpr size_t kDirect = sizeof(c->stage), kChunk = 256 << 10;
  std::lock_guard<std::mutex> g(c->mu);
  if (c->pend_len == 0) {
    size_t i = 0;
    while (i < iovcnt && iov[i].iov_len == 0) ++i;
    if (i == iovcnt) return 0;
    if (iov[i].iov_len >= kDirect) {
      c->pend = static_cast<const uint8_t *>(iov[i].iov_base);
      c->pend_len = std::min(iov[i].iov_len, kChunk);
    } else {
      size_t k = 0;
      for (; i < iovcnt && k < sizeof(c->stage); ++i) {
        if (iov[i].iov_len >= kDirect && k > 0) break;
        const size_t take = std::min(iov[i].iov_len, sizeof(c->stage) - k);
        memcpy(c->stage + k, iov[i].iov_base, take);
        k += take;
      }
      c->pend = c->stage;
      c->pend_len = k;
    }
  }
  errno = 0;
  A().ERR_clear_error();
  const int rc = A().SSL_write(c->ssl, c->pend, static_cast<int>(c->pend_len));
  if (rc <= 0) {
    const ssize_t r = SslFailed(c, rc, events);
    if (r == 0) errno = EPIPE;
    return -1;
  }
  c->pend_len = 0;  // without partial writes, a success wrote all of it
  return rc;
}

}  // namespace kvblocks
