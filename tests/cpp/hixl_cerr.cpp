// SPDX-License-Identifier: Apache-2.0
// Written like CANN's hixl samples: only hixl/hixl.h is included, yet std::cerr, std::endl,
// std::string and std::map are used, as CANN's header brings them in. Two engines in one process:
// the client connects, writes into the server's registered buffer, notifies; the server checks.
// Built with -D_GLIBCXX_USE_CXX11_ABI=0. usage: hixl_cerr PORT
#include "hixl/hixl.h"

using namespace hixl;

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  const std::string server_name = std::string("127.0.0.1:") + argv[1];
  Hixl server, client;
  std::map<AscendString, AscendString> options{{OPTION_AUTO_CONNECT, "0"}};
  if (server.Initialize(server_name.c_str(), options) != SUCCESS) {
    std::cerr << "[hixl_cerr] server Initialize failed" << std::endl;
    return 3;
  }
  if (client.Initialize("127.0.0.1", {}) != SUCCESS) {
    std::cerr << "[hixl_cerr] client Initialize failed" << std::endl;
    return 4;
  }
  std::vector<uint8_t> target(4096, 0), source(4096, 0x5A);
  MemDesc tdesc{}, sdesc{};
  tdesc.addr = reinterpret_cast<uintptr_t>(target.data());
  tdesc.len = target.size();
  sdesc.addr = reinterpret_cast<uintptr_t>(source.data());
  sdesc.len = source.size();
  MemHandle th = nullptr, sh = nullptr;
  if (server.RegisterMem(tdesc, MEM_DEVICE, th) != SUCCESS || client.RegisterMem(sdesc, MEM_HOST, sh) != SUCCESS) {
    std::cerr << "[hixl_cerr] RegisterMem failed" << std::endl;
    return 5;
  }
  if (client.Connect(server_name.c_str(), 5000) != SUCCESS) {
    std::cerr << "[hixl_cerr] Connect failed" << std::endl;
    return 6;
  }
  TransferOpDesc op{sdesc.addr, tdesc.addr + 1024, 2048};
  if (client.TransferSync(server_name.c_str(), WRITE, {op}, 5000) != SUCCESS) {
    std::cerr << "[hixl_cerr] TransferSync failed" << std::endl;
    return 7;
  }
  NotifyDesc note;
  note.name = "written-by-the-client";
  note.notify_msg = AscendString("2048 bytes at offset 1024, a message longer than any inline buffer", 66);
  if (client.SendNotify(server_name.c_str(), note, 5000) != SUCCESS) return 8;
  std::vector<NotifyDesc> got;
  if (server.GetNotifies(got) != SUCCESS || got.size() != 1 ||
      std::string(got[0].name.GetString(), got[0].name.GetLength()) != "written-by-the-client" ||
      !(got[0].notify_msg == note.notify_msg)) {
    std::cerr << "[hixl_cerr] notification not received as sent" << std::endl;
    return 9;
  }
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != ((i >= 1024 && i < 3072) ? 0x5A : 0)) {
      std::cerr << "[hixl_cerr] byte " << i << " differs" << std::endl;
      return 10;
    }
  }
  client.Disconnect(server_name.c_str(), 5000);
  client.DeregisterMem(sh);
  server.DeregisterMem(th);
  client.Finalize();
  server.Finalize();
  std::cerr << "[hixl_cerr] verified" << std::endl;
  return 0;
}
