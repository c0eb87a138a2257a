// SPDX-License-Identifier: Apache-2.0
// kvblocks: the types, constants and status codes of CANN's hixl engine (hixl/hixl_types.h), with
// the same names, values and member layout. Written from the published interface description.
#ifndef KVBLOCKS_HIXL_HIXL_TYPES_H_
#define KVBLOCKS_HIXL_HIXL_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "kvblocks/ge_types.h"

#ifdef FUNC_VISIBILITY
#define ASCEND_FUNC_VISIBILITY __attribute__((visibility("default")))
#else
#define ASCEND_FUNC_VISIBILITY
#endif

namespace hixl {

using Status = uint32_t;
using AscendString = ge::AscendString;
using TransferReq = void *;
using MemHandle = void *;

enum MemType { MEM_DEVICE, MEM_HOST };
enum TransferOp { READ, WRITE };
enum FeatureType : int32_t { AUTO_CONNECT = 0, CLIENT_SERVER_COMM = 1 };
enum class TransferStatus { WAITING, COMPLETED, TIMEOUT, FAILED };
enum class AsyncConnectStatus {
  NOT_CONNECT,
  CONNECT_PENDING,
  CONNECTING,
  CONNECTED,
  CONNECT_FAILED,
  DISCONNECT_PENDING,
  DISCONNECTING
};

struct MemDesc {
  uintptr_t addr;
  size_t len;
  uint8_t reserved[128] = {};
};

struct TransferOpDesc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  size_t len;
};

struct TransferArgs {
  const void *user_data = nullptr;
  uint8_t reserved[120] = {};
};

struct GetTransferStatusArgs {
  uint32_t max_query_count = UINT32_MAX;
  bool skip_waiting = false;
  uint8_t reserved[123] = {};
};

struct TransferResult {
  TransferReq req = nullptr;
  const void *user_data = nullptr;
  TransferStatus status = TransferStatus::WAITING;
  uint8_t reserved[108] = {};
};

struct NotifyDesc {
  AscendString name;
  AscendString notify_msg;
};

constexpr const char OPTION_ENABLE_USE_FABRIC_MEM[] = "EnableUseFabricMem";
constexpr const char OPTION_RDMA_TRAFFIC_CLASS[] = "RdmaTrafficClass";
constexpr const char OPTION_RDMA_SERVICE_LEVEL[] = "RdmaServiceLevel";
constexpr const char OPTION_BUFFER_POOL[] = "BufferPool";
constexpr const char OPTION_GLOBAL_RESOURCE_CONFIG[] = "GlobalResourceConfig";
constexpr const char OPTION_AUTO_CONNECT[] = "AutoConnect";
constexpr const char OPTION_LOCAL_COMM_RES[] = "LocalCommRes";

constexpr Status SUCCESS = 0U;
constexpr Status PARAM_INVALID = 103900U;
constexpr Status TIMEOUT = 103901U;
constexpr Status NOT_CONNECTED = 103902U;
constexpr Status ALREADY_CONNECTED = 103903U;
constexpr Status NOTIFY_FAILED = 103904U;
constexpr Status UNSUPPORTED = 103905U;
constexpr Status FAILED = 503900U;
constexpr Status RESOURCE_EXHAUSTED = 203900U;

constexpr int32_t FEATURE_SUPPORTED = 1;
constexpr int32_t FEATURE_NOT_SUPPORTED = 0;

}  // namespace hixl

#endif  // KVBLOCKS_HIXL_HIXL_TYPES_H_
