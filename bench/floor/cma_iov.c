// SPDX-License-Identifier: Apache-2.0
// What process_vm_readv costs per remote iovec, from C alone: 64 MiB read from a forked child's
// anonymous memory (what a same-host peer's registered tensor is) in iovecs of 256 B .. 1 MiB, the
// ranges back to back ("x1") or every other one ("x2": a head slice of half the heads), 1024 iovecs
// per call, one thread; then memcpy of the same shapes. The kernel pins the remote pages once per
// remote iovec, so a 256-byte iovec costs about what a 4 KiB one does: this is why the cma path
// merges ranges adjacent on the remote side and reads small gaps (transport/cma/cma_path.cc), and
// why a head slice of half of each token's bytes cannot reach the bandwidth of a plain transfer
// there (it either pays per small iovec or reads the skipped half too).
//   cc -O2 bench/floor/cma_iov.c -o cma_iov && ./cma_iov [rounds]
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOTAL ((size_t)64 << 20)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static struct iovec l[1024], r[1024];

// Seconds to read TOTAL bytes in iovecs of `sz`, taken every `stride` x sz of the remote.
static double readv_time(pid_t child, uint8_t *local, uint8_t *remote, size_t sz, int stride) {
  double t0 = now();
  for (size_t off = 0; off < TOTAL;) {
    int n = 0;
    for (; n < 1024 && off < TOTAL; ++n, off += sz) {
      l[n].iov_base = local + off;
      r[n].iov_base = remote + off * stride;
      l[n].iov_len = r[n].iov_len = sz;
    }
    if (process_vm_readv(child, l, n, r, n, 0) != (ssize_t)(n * sz)) {
      perror("process_vm_readv");
      exit(1);
    }
  }
  return now() - t0;
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 3;
  uint8_t *remote = mmap(0, 2 * TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint8_t *local = mmap(0, 2 * TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(remote, 1, 2 * TOTAL);
  memset(local, 2, 2 * TOTAL);
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  const size_t sizes[] = {256, 1024, 4096, 32768, 1 << 20};
  printf("%-8s %-7s %s\n", "iovec", "stride", "ms per 64 MiB, GB/s, ns per iovec (each round)");
  for (int k = 0; k < 5; ++k)
    for (int stride = 1; stride <= 2; ++stride) {
      printf("%-8zu x%-6d", sizes[k], stride);
      for (int i = 0; i < rounds; ++i) {
        const double dt = readv_time(child, local, remote, sizes[k], stride);
        printf("  %6.1f ms %5.2f GB/s %5.0f ns", dt * 1e3, TOTAL / dt / 1e9, dt * 1e9 / (TOTAL / sizes[k]));
      }
      printf("\n");
    }
  for (int k = 0; k < 5; ++k) {
    const size_t sz = sizes[k];
    const double t0 = now();
    for (size_t off = 0; off < TOTAL; off += sz) memcpy(local + off, remote + 2 * off, sz);
    const double dt = now() - t0;
    printf("memcpy %-8zu x2  %6.1f ms %5.2f GB/s\n", sz, dt * 1e3, TOTAL / dt / 1e9);
  }
  kill(child, SIGKILL);
  wait(NULL);
  return 0;
}
