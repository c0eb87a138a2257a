// SPDX-License-Identifier: Apache-2.0
// Shared by the two example programs: a file barrier and the data pattern.
#ifndef KVBLOCKS_TEST_CPP_COMMON_H_
#define KVBLOCKS_TEST_CPP_COMMON_H_
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

inline void Signal(const std::string &dir, const std::string &name) { std::ofstream(dir + "/" + name) << "1"; }

inline bool WaitFor(const std::string &dir, const std::string &name, int timeout_s = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (!std::ifstream(dir + "/" + name).good()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "timed out waiting for %s\n", name.c_str());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Distinct content per owner, tensor and element.
inline int32_t Pattern(int owner, int tensor, int element) { return owner * 1000000 + tensor * 10000 + element; }

#endif  // KVBLOCKS_TEST_CPP_COMMON_H_
