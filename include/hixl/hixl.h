// SPDX-License-Identifier: Apache-2.0
// kvblocks: CANN's hixl engine (hixl/hixl.h) with the same names and signatures, implemented on the
// kvblocks runtime (libllm_datadist.so): address-based transfers between registered host memory
// ("device" memory is served by host memory), over in-process, same-host or TCP paths.
#ifndef KVBLOCKS_HIXL_HIXL_H_
#define KVBLOCKS_HIXL_HIXL_H_

// What CANN's header brings in through its own includes, which programs written against it use
// without including themselves (std::cerr, std::string, ...).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hixl/hixl_types.h"

namespace hixl {

class HixlImpl;

class __attribute__((visibility("default"))) Hixl {
 public:
  Hixl();
  ~Hixl();  // calls Finalize()
  Hixl(const Hixl &) = delete;
  Hixl &operator=(const Hixl &) = delete;

  Status Initialize(const AscendString &local_engine, const std::map<AscendString, AscendString> &options);
  void Finalize();
  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle);
  Status DeregisterMem(MemHandle mem_handle);
  Status Connect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000);
  Status GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status);
  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses);
  Status TransferSync(const AscendString &remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc> &op_descs, int32_t timeout_in_millis = 1000);
  Status TransferAsync(const AscendString &remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc> &op_descs, const TransferArgs &optional_args,
                       TransferReq &req);
  Status GetTransferStatus(const TransferReq &req, TransferStatus &status);
  Status GetTransferStatus(const GetTransferStatusArgs &args, std::vector<TransferResult> &results);
  Status SendNotify(const AscendString &remote_engine, const NotifyDesc &notify, int32_t timeout_in_millis = 1000);
  Status GetNotifies(std::vector<NotifyDesc> &notifies);
  static Status GetCapability(FeatureType feature_type, int32_t &value);

 private:
  std::unique_ptr<HixlImpl> impl_;
};

}  // namespace hixl

#endif  // KVBLOCKS_HIXL_HIXL_H_
