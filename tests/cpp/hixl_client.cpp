// SPDX-License-Identifier: Apache-2.0
// A hixl client written against CANN's hixl/hixl.h: connects to the server, reads its buffer
// (checks 0xAA), writes 0x5A into its first 4 KiB, asynchronously too, then notifies.
// Usage: hixl_client SERVER_PORT SYNC_DIR
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "hixl/hixl.h"

using namespace hixl;

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  const std::string server = std::string("127.0.0.1:") + argv[1];
  const std::string dir = argv[2];
  uintptr_t remote = 0;
  for (int i = 0; i < 3000 && remote == 0; ++i) {
    std::ifstream f(dir + "/addr");
    if (!(f >> remote)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (remote == 0) return 3;
  int32_t value = 0;
  if (Hixl::GetCapability(AUTO_CONNECT, value) != SUCCESS || value != FEATURE_SUPPORTED) return 4;
  Hixl engine;
  if (engine.Initialize("127.0.0.1", {}) != SUCCESS) return 5;  // client only
  std::vector<uint8_t> buf(1 << 20, 0);
  MemDesc desc{};
  desc.addr = reinterpret_cast<uintptr_t>(buf.data());
  desc.len = buf.size();
  MemHandle handle = nullptr;
  if (engine.RegisterMem(desc, MEM_HOST, handle) != SUCCESS) return 6;
  if (engine.Connect(server.c_str(), 5000) != SUCCESS) return 7;
  std::vector<TransferOpDesc> descs;
  for (size_t off = 0; off < buf.size(); off += 65536) descs.push_back({desc.addr + off, remote + off, 65536});
  if (engine.TransferSync(server.c_str(), READ, descs, 10000) != SUCCESS) return 8;
  for (uint8_t b : buf)
    if (b != 0xAA) return 9;
  std::fill(buf.begin(), buf.begin() + 4096, 0x5A);
  TransferArgs args;
  args.user_data = &buf;
  TransferReq req = nullptr;
  if (engine.TransferAsync(server.c_str(), WRITE, {{desc.addr, remote, 4096}}, args, req) != SUCCESS) return 10;
  NotifyDesc note{"written", "first 4 KiB"};
  if (engine.SendNotify(server.c_str(), note, 5000) != SUCCESS) return 11;  // after the write landed
  std::vector<TransferResult> results;
  if (engine.GetTransferStatus(GetTransferStatusArgs(), results) != SUCCESS || results.size() != 1 ||
      results[0].req != req || results[0].user_data != &buf || results[0].status != TransferStatus::COMPLETED)
    return 12;
  TransferStatus st;
  if (engine.GetTransferStatus(req, st) != PARAM_INVALID || st != TransferStatus::FAILED) return 13;
  if (engine.TransferSync(server.c_str(), READ, {{desc.addr, remote + (1 << 20), 1}}, 1000) != PARAM_INVALID) return 14;
  for (int i = 0; i < 3000; ++i) {
    if (std::ifstream(dir + "/server_done").good()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (engine.Disconnect(server.c_str(), 1000) != SUCCESS) return 15;
  if (engine.DeregisterMem(handle) != SUCCESS) return 16;
  engine.Finalize();
  std::ofstream(dir + "/client_done") << "1";
  std::printf("client: read, write, async status and notify verified\n");
  return 0;
}
