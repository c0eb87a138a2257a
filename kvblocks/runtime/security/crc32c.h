// SPDX-License-Identifier: Apache-2.0
// CRC32C (Castagnoli, iSCSI's RFC 3720 checksum) for kvblocks.Integrity=crc32c: the CPU's CRC32C
// instructions (SSE4.2 on x86-64, the ARMv8 CRC extension on aarch64), chosen at run time, with a
// portable slice-by-8 fallback. It detects accidental corruption only: it is not a MAC.
#ifndef KVBLOCKS_RUNTIME_SECURITY_CRC32C_H_
#define KVBLOCKS_RUNTIME_SECURITY_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvblocks {

// Extends `crc` (0 to start) over [p, p+n): Crc32c(Crc32c(0, a), b) == Crc32c(0, a || b).
uint32_t Crc32c(uint32_t crc, const void *p, size_t n);
// The same, always with the table-driven code (tests compare the two).
uint32_t Crc32cPortable(uint32_t crc, const void *p, size_t n);
// True when Crc32c uses the CPU's instructions.
bool Crc32cHardware();

// The implementations, slowest first: slice-by-8 tables, the crc32 instruction, carry-less folding
// of 256- or 512-bit lanes (x86-64 with VPCLMULQDQ and AVX2 or AVX-512). Crc32c uses the best the CPU
// has; Crc32cWith runs a given one (one the CPU lacks becomes the best it has below it), so tests
// cover each and benchmarks compare them.
enum class Crc32cKernel { kPortable, kInstructions, kFold256, kHybrid256, kFold512 };
Crc32cKernel Crc32cBest();
uint32_t Crc32cWith(Crc32cKernel k, uint32_t crc, const void *p, size_t n);
const char *Crc32cKernelName(Crc32cKernel k);

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_SECURITY_CRC32C_H_
