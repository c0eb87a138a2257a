// SPDX-License-Identifier: Apache-2.0
// A hixl server written against CANN's hixl/hixl.h: registers a 1 MiB buffer of 0xAA, publishes its
// address in a file, waits for the client's notification, checks the bytes the client wrote
// before it, and exits 0. Usage: hixl_server PORT SYNC_DIR
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"

using namespace hixl;

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  const std::string name = std::string("127.0.0.1:") + argv[1];
  const std::string dir = argv[2];
  Hixl engine;
  std::map<AscendString, AscendString> options{{OPTION_AUTO_CONNECT, "0"}};
  if (engine.Initialize(name.c_str(), options) != SUCCESS) return 3;
  std::vector<uint8_t> buf(1 << 20, 0xAA);
  MemHandle handle = nullptr;
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(buf.data());
  desc.len = buf.size();
  if (engine.RegisterMem(desc, MEM_DEVICE, handle) != SUCCESS || handle == nullptr) return 4;
  {
    std::ofstream f(dir + "/addr.tmp");
    f << desc.addr;
  }
  std::rename((dir + "/addr.tmp").c_str(), (dir + "/addr").c_str());
  std::vector<NotifyDesc> got;
  for (int i = 0; i < 3000 && got.empty(); ++i) {
    if (engine.GetNotifies(got) != SUCCESS) return 5;
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (got.size() != 1 || std::string(got[0].name.GetString()) != "written") return 6;
  for (size_t i = 0; i < 4096; ++i)
    if (buf[i] != 0x5A) return 7;  // the client's WRITE landed before its notification
  std::printf("server: notification after the write verified\n");
  std::ofstream(dir + "/server_done") << "1";
  for (int i = 0; i < 500; ++i) {  // the client disconnects, then we finalize
    if (std::ifstream(dir + "/client_done").good()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  engine.DeregisterMem(handle);
  engine.Finalize();
  return 0;
}
