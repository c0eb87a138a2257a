// SPDX-License-Identifier: Apache-2.0
// CRC32C, reflected polynomial 0x82F63B78. The hardware loop runs three independent CRCs over three
// adjacent blocks at once (the crc32 instruction has a latency of 3 cycles and a throughput of 1) and
// joins them with precomputed "append N zero bytes" operators (after Mark Adler's crc32c.c). On x86-64
// CPUs with VPCLMULQDQ, long buffers are folded 256 bytes at a time with carry-less multiplications
// instead (Intel's "Fast CRC computation using PCLMULQDQ"): 512-bit lanes with AVX-512, 256-bit ones
// with AVX2 (AMD Zen 3, Intel client cores without AVX-512); the last 16 folded bytes go through the
// crc32 instruction.
#include "security/crc32c.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

namespace kvblocks {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// ---- portable: slice-by-8 tables, built at compile time
struct Slice8 {
  uint32_t t[8][256];
  constexpr Slice8() : t() {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n)
      for (int k = 1; k < 8; ++k) t[k][n] = (t[k - 1][n] >> 8) ^ t[0][t[k - 1][n] & 0xFF];
  }
};
constexpr Slice8 kSlice8;

uint64_t LoadLe64(const uint8_t *p) {
  uint64_t w;
  memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  w = __builtin_bswap64(w);
#endif
  return w;
}

uint32_t PortableRaw(uint32_t c, const uint8_t *p, size_t n) {
  const auto &t = kSlice8.t;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t w = LoadLe64(p) ^ c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
  }
  for (; n > 0; --n) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__) || defined(__aarch64__)
// ---- operators that append 2^k zero bytes to a CRC, as four byte-indexed tables
uint32_t Gf2Times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat)
    if (vec & 1) sum ^= *mat;
  return sum;
}

void Gf2Square(uint32_t *square, const uint32_t *mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2Times(mat, mat[n]);
}

// The operator for `len` zero bytes; `len` is a power of two.
void ZerosOp(uint32_t even[32], size_t len) {
  uint32_t odd[32];
  odd[0] = kPoly;  // one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  Gf2Square(even, odd);  // two bits
  Gf2Square(odd, even);  // four bits
  for (;;) {
    Gf2Square(even, odd);  // doubles: 1, 4, 16... bytes
    if ((len >>= 1) == 0) return;
    Gf2Square(odd, even);
    if ((len >>= 1) == 0) break;
  }
  memcpy(even, odd, sizeof(odd));
}

// The operator for any `len` zero bytes: the product of those of its bits.
void ZerosOpAny(uint32_t out[32], size_t len) {
  for (int n = 0; n < 32; ++n) out[n] = 1u << n;
  for (size_t bit = 1; bit != 0 && bit <= len; bit <<= 1) {
    if ((len & bit) == 0) continue;
    uint32_t op[32], prod[32];
    ZerosOp(op, bit);
    for (int n = 0; n < 32; ++n) prod[n] = Gf2Times(op, out[n]);
    memcpy(out, prod, sizeof(prod));
  }
}

struct Shift {
  uint32_t t[4][256];
  explicit Shift(size_t len) {
    uint32_t op[32];
    ZerosOpAny(op, len);
    for (uint32_t n = 0; n < 256; ++n)
      for (int k = 0; k < 4; ++k) t[k][n] = Gf2Times(op, n << (8 * k));
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

constexpr size_t kLong = 8192, kShort = 256;  // block lengths of the three-way loops
const Shift &LongShift() {
  static const Shift s(kLong);
  return s;
}
const Shift &ShortShift() {
  static const Shift s(kShort);
  return s;
}
#endif

#if defined(__x86_64__)
#define KVB_CRC_TARGET __attribute__((target("sse4.2")))
KVB_CRC_TARGET inline uint32_t Step64(uint32_t c, const uint8_t *p) {
  uint64_t w;
  memcpy(&w, p, 8);
  return static_cast<uint32_t>(_mm_crc32_u64(c, w));
}
KVB_CRC_TARGET inline uint32_t Step8(uint32_t c, uint8_t b) { return _mm_crc32_u8(c, b); }
bool CpuHasCrc() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2) != 0;
}
#elif defined(__aarch64__)
#define KVB_CRC_TARGET __attribute__((target("+crc")))
KVB_CRC_TARGET inline uint32_t Step64(uint32_t c, const uint8_t *p) {
  uint64_t w;
  memcpy(&w, p, 8);
  return __crc32cd(c, w);
}
KVB_CRC_TARGET inline uint32_t Step8(uint32_t c, uint8_t b) { return __crc32cb(c, b); }
bool CpuHasCrc() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#endif

#if defined(__x86_64__)
// ---- carry-less folding (AVX-512 VPCLMULQDQ)
// The pair of constants that moves a 128-bit lane `bytes` further down the stream: x^(8*bytes+32) and
// x^(8*bytes-32) mod P, bit-reflected and shifted left by one (the reflected product's off-by-one).
uint64_t FoldK(unsigned e) {
  uint64_t r = 1;  // x^e mod P, bit i = coefficient of x^i
  for (unsigned i = 0; i < e; ++i) {
    r <<= 1;
    if (r >> 32) r ^= 0x11EDC6F41ULL;
  }
  uint32_t rev = 0;
  for (int i = 0; i < 32; ++i) rev |= ((r >> i) & 1u) << (31 - i);
  return uint64_t{rev} << 1;
}

struct FoldConsts {
  uint64_t k[5][2];  // lo, hi for 256, 64, 48, 32, 16 bytes
  FoldConsts() {
    const unsigned bytes[5] = {256, 64, 48, 32, 16};
    for (int i = 0; i < 5; ++i) k[i][0] = FoldK(8 * bytes[i] + 32), k[i][1] = FoldK(8 * bytes[i] - 32);
  }
};
const FoldConsts &Folds() {
  static const FoldConsts f;
  return f;
}

// 128-bit steps shared by both widths: the narrower target, so the 512-bit code can inline them.
#define KVB_FOLD256_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2")))
KVB_FOLD256_TARGET inline __m128i Fold128(__m128i x, const uint64_t k[2], __m128i data) {
  const __m128i kk = _mm_set_epi64x(static_cast<long long>(k[1]), static_cast<long long>(k[0]));
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, kk, 0x00), _mm_clmulepi64_si128(x, kk, 0x11)), data);
}
// Folded 16 bytes, as data after a zero CRC, have the CRC of everything folded into them.
KVB_FOLD256_TARGET inline uint32_t CrcOfFolded(__m128i a) {
  const uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(a)), hi = static_cast<uint64_t>(_mm_extract_epi64(a, 1));
  return static_cast<uint32_t>(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi));
}

#define KVB_FOLD_TARGET __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))
KVB_FOLD_TARGET inline __m512i Fold512(__m512i x, __m512i k, __m512i data) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), data,
                                   0x96);
}
KVB_FOLD_TARGET inline __m512i Broadcast(const uint64_t k[2]) {
  const long long lo = static_cast<long long>(k[0]), hi = static_cast<long long>(k[1]);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}

// `c` (raw) over n >= 256 bytes; returns the raw CRC of what it folded and how many bytes that was
// (a multiple of 16); the caller finishes the rest.
KVB_FOLD_TARGET uint32_t FoldRaw(uint32_t c, const uint8_t *p, size_t n, size_t *done) {
  const FoldConsts &f = Folds();
  __m512i x[4];
  for (int i = 0; i < 4; ++i) x[i] = _mm512_loadu_si512(p + 64 * i);
  x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(c))));
  size_t off = 256;
  const __m512i k256 = Broadcast(f.k[0]);
  for (; n - off >= 256; off += 256)
    for (int i = 0; i < 4; ++i) x[i] = Fold512(x[i], k256, _mm512_loadu_si512(p + off + 64 * i));
  const __m512i k64 = Broadcast(f.k[1]);
  for (int i = 1; i < 4; ++i) x[i] = Fold512(x[i - 1], k64, x[i]);  // four accumulators into x[3]
  // x[3]'s four lanes into its last one, then whole 16-byte blocks one at a time.
  __m128i a = _mm512_maskz_extracti32x4_epi32(0xF, x[3], 3);
  a = Fold128(_mm512_maskz_extracti32x4_epi32(0xF, x[3], 0), f.k[2], a);
  a = Fold128(_mm512_maskz_extracti32x4_epi32(0xF, x[3], 1), f.k[3], a);
  a = Fold128(_mm512_maskz_extracti32x4_epi32(0xF, x[3], 2), f.k[4], a);
  for (; n - off >= 16; off += 16) a = Fold128(a, f.k[4], _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + off)));
  *done = off;
  return CrcOfFolded(a);
}

KVB_FOLD256_TARGET inline __m256i Fold256(__m256i x, __m256i k, __m256i data) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11)),
                          data);
}
KVB_FOLD256_TARGET inline __m256i Broadcast256(const uint64_t k[2]) {
  const long long lo = static_cast<long long>(k[0]), hi = static_cast<long long>(k[1]);
  return _mm256_set_epi64x(hi, lo, hi, lo);
}
KVB_FOLD256_TARGET inline __m256i Load256(const uint8_t *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }
// Eight accumulators over 256 consecutive bytes into one 16-byte lane.
KVB_FOLD256_TARGET inline __m128i Reduce8(__m256i x[8], const FoldConsts &f) {
  const __m256i k32 = Broadcast256(f.k[3]);
  for (int i = 1; i < 8; ++i) x[i] = Fold256(x[i - 1], k32, x[i]);
  return Fold128(_mm256_castsi256_si128(x[7]), f.k[4], _mm256_extracti128_si256(x[7], 1));
}

// FoldRaw with eight 256-bit accumulators (16 lanes of 16 bytes: enough independent multiplications
// to cover their latency).
KVB_FOLD256_TARGET uint32_t FoldRaw256(uint32_t c, const uint8_t *p, size_t n, size_t *done) {
  const FoldConsts &f = Folds();
  __m256i x[8];
  for (int i = 0; i < 8; ++i) x[i] = Load256(p + 32 * i);
  x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(c))));
  size_t off = 256;
  const __m256i k256 = Broadcast256(f.k[0]);
  for (; n - off >= 256; off += 256)
    for (int i = 0; i < 8; ++i) x[i] = Fold256(x[i], k256, Load256(p + off + 32 * i));
  __m128i a = Reduce8(x, f);
  for (; n - off >= 16; off += 16) a = Fold128(a, f.k[4], _mm_loadu_si128(reinterpret_cast<const __m128i *>(p + off)));
  *done = off;
  return CrcOfFolded(a);
}

// Folding and the crc32 instruction use different execution units: the hybrid runs both at once
// over one block of kHybridBytes, the first kHybridFold bytes folded 256 at a time and the rest as
// three crc32 streams of kHybridLane bytes, 64 bytes of each stream per fold step; the parts are
// joined by the "append zero bytes" tables. On AMD Zen 3 each alone does about 8 bytes a cycle.
constexpr size_t kHybridSteps = 32, kHybridFold = 256 * kHybridSteps, kHybridLane = 64 * kHybridSteps;
constexpr size_t kHybridBytes = kHybridFold + 3 * kHybridLane;
const Shift &LaneShift() {
  static const Shift s(kHybridLane);
  return s;
}
const Shift &StreamsShift() {
  static const Shift s(3 * kHybridLane);
  return s;
}

KVB_FOLD256_TARGET uint32_t HybridBlock(uint32_t c, const uint8_t *p) {
  const FoldConsts &f = Folds();
  const uint8_t *s = p + kHybridFold;  // stream 0; streams 1 and 2 follow, kHybridLane apart
  __m256i x[8];
  for (int i = 0; i < 8; ++i) x[i] = Load256(p + 32 * i);
  x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(c))));
  const __m256i k256 = Broadcast256(f.k[0]);
  uint64_t c0 = 0, c1 = 0, c2 = 0;
  for (size_t step = 0; step < kHybridSteps; ++step) {
    if (step + 1 < kHybridSteps)
      for (int i = 0; i < 8; ++i) x[i] = Fold256(x[i], k256, Load256(p + 256 * (step + 1) + 32 * i));
    for (size_t o = 64 * step; o < 64 * step + 64; o += 8) {
      uint64_t w0, w1, w2;
      memcpy(&w0, s + o, 8);
      memcpy(&w1, s + kHybridLane + o, 8);
      memcpy(&w2, s + 2 * kHybridLane + o, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
  }
  const uint32_t folded = CrcOfFolded(Reduce8(x, f));
  const Shift &lane = LaneShift();
  const uint32_t streams = lane(lane(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
  return StreamsShift()(folded) ^ streams;
}

// The widest fold this CPU runs: 512, 256, or 0 (none).
int CpuFoldBits() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("vpclmulqdq") || !__builtin_cpu_supports("pclmul")) return 0;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return 512;
  return __builtin_cpu_supports("avx2") ? 256 : 0;
}
#endif

#if defined(KVB_CRC_TARGET)
// Three CRCs over blocks [p, p+len), [p+len, p+2len), [p+2len, p+3len), joined into `c`.
KVB_CRC_TARGET uint32_t ThreeWay(uint32_t c, const uint8_t *p, size_t len, const Shift &shift) {
  uint32_t c1 = 0, c2 = 0;
  for (const uint8_t *end = p + len; p < end; p += 8) {
    c = Step64(c, p);
    c1 = Step64(c1, p + len);
    c2 = Step64(c2, p + 2 * len);
  }
  return shift(shift(c) ^ c1) ^ c2;
}

constexpr size_t kFoldMin = 1024;  // below it the crc32 loop wins: folding has a fixed cost

KVB_CRC_TARGET uint32_t HardwareRaw(Crc32cKernel k, uint32_t c, const uint8_t *p, size_t n) {
#if defined(__x86_64__)
  if (k == Crc32cKernel::kHybrid256)
    for (; n >= kHybridBytes; n -= kHybridBytes, p += kHybridBytes) c = HybridBlock(c, p);
  if (n >= kFoldMin && k >= Crc32cKernel::kFold256) {
    size_t done = 0;
    c = k == Crc32cKernel::kFold512 ? FoldRaw(c, p, n, &done) : FoldRaw256(c, p, n, &done);
    p += done;
    n -= done;
  }
#endif
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) c = Step8(c, *p++);
  for (; n >= 3 * kLong; n -= 3 * kLong, p += 3 * kLong) c = ThreeWay(c, p, kLong, LongShift());
  for (; n >= 3 * kShort; n -= 3 * kShort, p += 3 * kShort) c = ThreeWay(c, p, kShort, ShortShift());
  for (; n >= 8; n -= 8, p += 8) c = Step64(c, p);
  for (; n > 0; --n) c = Step8(c, *p++);
  return c;
}

Crc32cKernel Detect() {
  if (!CpuHasCrc()) return Crc32cKernel::kPortable;
  LongShift();  // build the tables once, before any transfer needs them
  ShortShift();
#if defined(__x86_64__)
  Folds();
  const int bits = CpuFoldBits();
  if (bits == 256) {
    LaneShift();
    StreamsShift();
    return Crc32cKernel::kHybrid256;
  }
  if (bits == 512) return Crc32cKernel::kFold512;
#endif
  return Crc32cKernel::kInstructions;
}
#else
Crc32cKernel Detect() { return Crc32cKernel::kPortable; }
#endif

}  // namespace

Crc32cKernel Crc32cBest() {
  static const Crc32cKernel best = Detect();
  return best;
}

uint32_t Crc32cWith(Crc32cKernel k, uint32_t crc, const void *p, size_t n) {
  k = std::min(k, Crc32cBest());
#if defined(KVB_CRC_TARGET)
  if (k != Crc32cKernel::kPortable) return ~HardwareRaw(k, ~crc, static_cast<const uint8_t *>(p), n);
#endif
  return ~PortableRaw(~crc, static_cast<const uint8_t *>(p), n);
}

uint32_t Crc32cPortable(uint32_t crc, const void *p, size_t n) { return Crc32cWith(Crc32cKernel::kPortable, crc, p, n); }

uint32_t Crc32c(uint32_t crc, const void *p, size_t n) { return Crc32cWith(Crc32cBest(), crc, p, n); }

bool Crc32cHardware() { return Crc32cBest() != Crc32cKernel::kPortable; }

const char *Crc32cKernelName(Crc32cKernel k) {
  switch (k) {
    case Crc32cKernel::kPortable: return "portable";
    case Crc32cKernel::kInstructions: return "crc32";
    case Crc32cKernel::kFold256: return "fold256";
    case Crc32cKernel::kHybrid256: return "hybrid256";
    case Crc32cKernel::kFold512: return "fold512";
  }
  return "?";
}

}  // namespace kvblocks
