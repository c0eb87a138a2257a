// SPDX-License-Identifier: Apache-2.0
// Runs the runtime's own HmacSha256 and Proof (kvblocks/runtime/security/hmac.cc, compiled in) on
// lines from stdin, for tests/test_hmac_kat.py:
//   hmac KEYHEX MSGHEX               -> HMAC-SHA256(key, msg), hex
//   proof KEYHEX LABEL TRANSCRIPTHEX -> Proof(key, label, transcript), hex
// An empty hex field is written "-".
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "security/auth.h"

namespace {

std::string Unhex(const std::string &h) {
  std::string out;
  if (h == "-") return out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

void PrintHex(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; ++i) std::printf("%02x", p[i]);
  std::printf("\n");
}

const uint8_t *Bytes(const std::string &s) { return reinterpret_cast<const uint8_t *>(s.data()); }

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op, key, a, b;
    in >> op >> key >> a;
    uint8_t out[32];
    if (op == "hmac") {
      const std::string k = Unhex(key), m = Unhex(a);
      kvblocks::HmacSha256(Bytes(k), k.size(), Bytes(m), m.size(), out);
    } else if (op == "proof" && (in >> b)) {
      const std::string k = Unhex(key);
      kvblocks::Proof(Bytes(k), k.size(), a.c_str(), Unhex(b), out);
    } else {
      std::fprintf(stderr, "bad line: %s\n", line.c_str());
      return 2;
    }
    PrintHex(out, sizeof(out));
  }
  return 0;
}
