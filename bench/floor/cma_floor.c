// SPDX-License-Identifier: Apache-2.0
// The kernel's floor for same-host copies, from C alone: memcpy and process_vm_readv/writev of the
// same random blocks (16 KiB unless told) on 1 and N threads, against a forked child's anonymous memory (what a
// same-host peer's registered tensors are). kvblocks' shm and cma paths cannot beat these. The N-thread
// rows use persistent spinning threads (an ideal pool); the 1-thread rows run in the calling thread.
//   cc -O2 -pthread bench/floor/cma_floor.c -o cma_floor && ./cma_floor [threads [block KiB [4k]]]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
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

static size_t BB = 16 << 10;  // block bytes (argv[2], KiB)
#define MAXIOV 1024

static size_t nblocks;          // blocks moved per call
static uint8_t *remote, *local; // remote: the child's copy (same address after fork)
static size_t *ids;             // random block ids on the remote side
static pid_t child;
static int mode;                // 0 memcpy (local only), 1 readv, 2 writev

struct part { size_t begin, end; };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *arg) {
  const struct part *p = arg;
  struct iovec l[MAXIOV], r[MAXIOV];
  size_t n = 0;
  for (size_t i = p->begin; i < p->end; ++i) {
    uint8_t *dst = local + i * BB, *src = remote + ids[i] * BB;
    if (mode == 0) { memcpy(dst, src, BB); continue; }
    l[n] = (struct iovec){dst, BB};
    r[n] = (struct iovec){src, BB};
    if (++n == MAXIOV || i + 1 == p->end) {
      ssize_t got = mode == 1 ? process_vm_readv(child, l, n, r, n, 0) : process_vm_writev(child, l, n, r, n, 0);
      if (got != (ssize_t)(n * BB)) { perror("process_vm_*"); exit(1); }
      n = 0;
    }
  }
  return NULL;
}

// The other threads are persistent and spin between calls: an ideal pool (no wake-up cost), so the
// N-thread rows are the best any split of the same calls can do.
static struct part parts[16];
static volatile int gen, done, nworkers;

static void *worker(void *arg) {
  const int k = (int)(intptr_t)arg;
  for (int seen = 0;;) {
    while (__atomic_load_n(&gen, __ATOMIC_ACQUIRE) == seen) sched_yield();  // the core stays free for others
    seen = gen;
    run(&parts[k]);
    __atomic_add_fetch(&done, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

static double once(int threads) {
  for (; nworkers < threads - 1; ++nworkers) {
    pthread_t t;
    pthread_create(&t, NULL, worker, (void *)(intptr_t)(nworkers + 1));
  }
  for (int k = 0; k < threads; ++k) parts[k] = (struct part){nblocks * k / threads, nblocks * (k + 1) / threads};
  const int want = done + threads - 1;
  double t0 = now();
  if (threads > 1) __atomic_add_fetch(&gen, 1, __ATOMIC_RELEASE);
  run(&parts[0]);
  while (threads > 1 && __atomic_load_n(&done, __ATOMIC_ACQUIRE) != want) {}
  return now() - t0;
}

static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }

static double median(int threads, int reps) {
  double s[64];
  once(threads);
  for (int i = 0; i < reps; ++i) s[i] = once(threads);
  qsort(s, reps, sizeof(double), cmp);
  return s[reps / 2];
}

int main(int argc, char **argv) {
  int nt = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (argc > 2) BB = (size_t)atoi(argv[2]) << 10;
  const size_t sizes[] = {2u << 20, 8u << 20, 32u << 20, 256u << 20};
  const size_t max = 256u << 20, pool = 2 * max / BB;
  remote = mmap(NULL, 2 * max, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  local = mmap(NULL, max, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const int huge = !(argc > 3 && strcmp(argv[3], "4k") == 0);  // "4k": 4 KiB pages, as numpy's arrays under 4 MiB
  if (huge) madvise(remote, 2 * max, MADV_HUGEPAGE);  // as numpy does for large arrays (THP "madvise" mode)
  if (huge) madvise(local, max, MADV_HUGEPAGE);
  ids = malloc(sizeof(size_t) * pool);
  for (size_t i = 0; i < pool; ++i) ids[i] = i;
  srand(7);
  for (size_t i = pool - 1; i > 0; --i) { size_t j = rand() % (i + 1), x = ids[i]; ids[i] = ids[j]; ids[j] = x; }
  int ready[2];
  if (pipe(ready) != 0) return 1;
  if ((child = fork()) == 0) {  // the peer: its own pages (touched after fork, so none is shared copy-on-write)
    memset(remote, 7, 2 * max);
    if (write(ready[1], "k", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char k;
  if (read(ready[0], &k, 1) != 1) return 1;
  memset(local, 1, max);
  memset(remote, 7, 2 * max);  // the memcpy rows read this process's own copy
  printf("%-8s %-10s %12s %12s %12s   (GB/s, median; %d threads vs 1)\n", "size", "op", "1 thread", "N threads",
         "N/1", nt);
  const char *names[] = {"memcpy", "readv", "writev"};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); ++s) {
    nblocks = sizes[s] / BB;
    for (mode = 0; mode < 3; ++mode) {
      int reps = sizes[s] >= (64u << 20) ? 9 : 31;
      double one = median(1, reps), all = median(nt, reps);
      printf("%-8zu %-10s %12.2f %12.2f %12.2f\n", sizes[s] >> 20, names[mode], sizes[s] / one / 1e9,
             sizes[s] / all / 1e9, one / all);
    }
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  return 0;
}
