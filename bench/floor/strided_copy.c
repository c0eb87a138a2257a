// SPDX-License-Identifier: Apache-2.0
// What the shapes of the layout cases cost memcpy alone, in one thread: 64 MiB moved contiguously,
// then in the ranges of each layout case (bench/kvblocks_bench/cases_layout.py), medians of 21
// rounds each, interleaved. Strided ranges leave the hardware prefetchers fetching lines no one
// reads (and, on the destination, lines no one writes), so on a memory-bound machine the shape
// alone sets a floor under the ratio any copier reaches; kvblocks' shm path cannot beat these.
//   cc -O2 bench/floor/strided_copy.c -o strided_copy && ./strided_copy
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define TOTAL ((size_t)64 << 20)
#define ROUNDS 21
#define C 256  // bytes of one head of one token

static uint8_t *src, *dst;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void contiguous(void) { memcpy(dst, src, TOTAL); }

// heads [0, 4) of 8 into [0, 4) of 8, NHD both sides: 1 KiB of every 2 KiB on both sides.
static void heads(void) {
  for (size_t o = 0; o < TOTAL; o += 4 * C) memcpy(dst + 2 * o, src + 2 * o, 4 * C);
}

// The layout/*/transform case: 16-token 8-head NHD blocks, heads [0, 4), into 32-token 4-head HND
// blocks, in destination order (256-byte ranges, the source read 256 B of every 2 KiB).
static void transform(void) {
  const size_t sb = 16 * 8 * C, db = 32 * 4 * C, nd = TOTAL / db;
  for (size_t j = 0; j < nd; ++j)
    for (size_t h = 0; h < 4; ++h)
      for (size_t t = 0; t < 32; ++t) {
        const size_t k = j * 32 + t;
        memcpy(dst + j * db + (h * 32 + t) * C, src + (k / 16) * sb + ((k % 16) * 8 + h) * C, C);
      }
}

// The layout/*/pairs case: every other 256-byte block, source and destination.
static void pairs(void) {
  for (size_t o = 0; o < TOTAL; o += C) memcpy(dst + 2 * o + C, src + 2 * o, C);
}

static int cmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(void) {
  src = mmap(0, 2 * TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  dst = mmap(0, 2 * TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(src, 1, 2 * TOTAL);
  memset(dst, 2, 2 * TOTAL);
  void (*fn[])(void) = {contiguous, heads, transform, pairs};
  const char *name[] = {"contiguous", "heads (1 KiB of 2 KiB)", "transform (256 B, NHD->HND)",
                        "pairs (256 B of 512 B)"};
  enum { N = sizeof(fn) / sizeof(fn[0]) };
  static double t[N][ROUNDS];
  for (int r = 0; r < ROUNDS; ++r)
    for (int i = 0; i < N; ++i) {
      const double t0 = now();
      fn[i]();
      t[i][r] = now() - t0;
    }
  for (int i = 0; i < N; ++i) qsort(t[i], ROUNDS, sizeof(double), cmp);
  const double base = t[0][ROUNDS / 2];
  for (int i = 0; i < N; ++i)
    printf("%-30s median %6.1f ms  %5.2f GB/s  ratio to contiguous %.2f\n", name[i], t[i][ROUNDS / 2] * 1e3,
           TOTAL / t[i][ROUNDS / 2] / 1e9, base / t[i][ROUNDS / 2]);
  return 0;
}
