// SPDX-License-Identifier: Apache-2.0
// Runs the runtime's own CRC32C (kvblocks/runtime/security/crc32c.cc, compiled in) on lines from
// stdin, for tests/test_crc32c_kat.py:
//   crc HEX       -> Crc32c(0, bytes) and Crc32cPortable(0, bytes), 8 hex digits each
//   split HEX K   -> Crc32c over the first K bytes, extended over the rest (incremental use)
//   random SEED N [K] -> N buffers of random length (0..200000) at random alignments: "ok" when
//                    kernel K (Crc32cKernel's number; default the best) and the portable code agree
//                    on every one, else the first difference
//   hw            -> 1 when the CPU's instructions are used
//   kernels       -> the best kernel's number and name
// An empty hex field is written "-".
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "security/crc32c.h"

namespace {

std::string Unhex(const std::string &h) {
  std::string out;
  if (h == "-") return out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

void Random(unsigned seed, int count, kvblocks::Crc32cKernel kernel) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf(200000 + 64);
  for (auto &b : buf) b = static_cast<uint8_t>(rng());
  for (int i = 0; i < count; ++i) {
    const size_t off = rng() % 64, len = rng() % 200000;
    const uint32_t seed_crc = static_cast<uint32_t>(rng());
    const uint32_t a = kvblocks::Crc32cWith(kernel, seed_crc, buf.data() + off, len);
    const uint32_t b = kvblocks::Crc32cPortable(seed_crc, buf.data() + off, len);
    if (a != b) {
      std::printf("differ:off=%zu,len=%zu,%08x,%08x\n", off, len, a, b);
      return;
    }
  }
  std::printf("ok\n");
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, hex;
    in >> cmd;
    if (cmd == "crc") {
      in >> hex;
      const std::string b = Unhex(hex);
      std::printf("%08x,%08x\n", kvblocks::Crc32c(0, b.data(), b.size()), kvblocks::Crc32cPortable(0, b.data(), b.size()));
    } else if (cmd == "split") {
      size_t k;
      in >> hex >> k;
      const std::string b = Unhex(hex);
      const uint32_t c = kvblocks::Crc32c(0, b.data(), k);
      std::printf("%08x\n", kvblocks::Crc32c(c, b.data() + k, b.size() - k));
    } else if (cmd == "random") {
      unsigned seed;
      int count, kernel = static_cast<int>(kvblocks::Crc32cBest());
      in >> seed >> count;
      in >> kernel;  // optional
      Random(seed, count, static_cast<kvblocks::Crc32cKernel>(kernel));
    } else if (cmd == "hw") {
      std::printf("%d\n", kvblocks::Crc32cHardware() ? 1 : 0);
    } else if (cmd == "kernels") {
      const kvblocks::Crc32cKernel best = kvblocks::Crc32cBest();
      std::printf("%d,%s\n", static_cast<int>(best), kvblocks::Crc32cKernelName(best));
    } else {
      std::printf("?\n");
    }
  }
  return 0;
}
