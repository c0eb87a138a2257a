// SPDX-License-Identifier: Apache-2.0
// A minimal C++ test harness for the runtime's unit tests: TEST(name) registers a case, CHECK(cond)
// records a failure with file and line and goes on. The binary lists its cases (--list) or runs the
// ones named on the command line (all without arguments); tests/unit/test_unit.py runs one per pytest
// item. No dependency beyond the compiler, so a backend author can build it anywhere.
#ifndef KVBLOCKS_TESTS_UNIT_UNIT_H_
#define KVBLOCKS_TESTS_UNIT_UNIT_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>

namespace unit {

inline std::map<std::string, std::function<void()>> &Cases() {
  static std::map<std::string, std::function<void()>> cases;
  return cases;
}
inline int &Failures() {
  static int n = 0;
  return n;
}
struct Register {
  Register(const char *name, std::function<void()> fn) { Cases()[name] = std::move(fn); }
};
// One generator per run, seeded from the environment (UNIT_SEED) so a failure can be replayed.
inline std::mt19937_64 &Rng() {
  static std::mt19937_64 rng([] {
    const char *s = std::getenv("UNIT_SEED");
    return s ? std::strtoull(s, nullptr, 10) : 20261203ULL;
  }());
  return rng;
}
inline uint64_t Rand(uint64_t below) { return below ? Rng()() % below : Rng()(); }

}  // namespace unit

#define UNIT_CAT2(a, b) a##b
#define UNIT_CAT(a, b) UNIT_CAT2(a, b)
#define TEST(name)                                                      \
  static void UNIT_CAT(test_, name)();                                  \
  static unit::Register UNIT_CAT(reg_, name)(#name, UNIT_CAT(test_, name)); \
  static void UNIT_CAT(test_, name)()
#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++unit::Failures();                                                            \
    }                                                                                \
  } while (0)

#endif  // KVBLOCKS_TESTS_UNIT_UNIT_H_
