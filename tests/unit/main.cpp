// SPDX-License-Identifier: Apache-2.0
// Runs the unit cases: `unit --list`, `unit NAME...` (exit 1 if any CHECK failed, 2 for an unknown name).
#include <cstdlib>
#include <cstring>

#include "unit.h"

int main(int argc, char **argv) {
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const auto &c : unit::Cases()) std::printf("%s\n", c.first.c_str());
    return 0;
  }
  int ran = 0;
  for (const auto &c : unit::Cases()) {
    bool wanted = argc == 1;
    for (int i = 1; i < argc; ++i) wanted |= c.first == argv[i];
    if (!wanted) continue;
    const int before = unit::Failures();
    c.second();
    ++ran;
    std::printf("%s %s\n", unit::Failures() == before ? "ok" : "FAILED", c.first.c_str());
  }
  if (ran < (argc == 1 ? 0 : argc - 1)) {
    std::fprintf(stderr, "unknown case name\n");
    return 2;
  }
  return unit::Failures() ? 1 : 0;
}
