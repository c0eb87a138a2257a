// SPDX-License-Identifier: Apache-2.0
// kvblocks: the ge:: types that CANN's llm_datadist.h re-exports (Status, AscendString, DataType).
#ifndef KVBLOCKS_GE_TYPES_H_
#define KVBLOCKS_GE_TYPES_H_

#include <cstdint>
#include <cstring>
#include <string>

namespace ge {

// CANN encodes statuses as 32-bit unsigned values (see llm_datadist.h for the LLM_* constants).
using Status = uint32_t;

// A small owning string. Like CANN's AscendString it converts implicitly from const char*,
// so `options[OPTION_DEVICE_ID] = "0";` compiles unchanged, and it orders for use as a map key.
class AscendString {
 public:
  AscendString() = default;
  AscendString(const char *name) : str_(name == nullptr ? "" : name) {}  // NOLINT: implicit by design
  AscendString(const char *name, size_t length) : str_(name == nullptr ? "" : std::string(name, length)) {}
  const char *GetString() const { return str_.c_str(); }
  size_t GetLength() const { return str_.size(); }
  bool operator<(const AscendString &o) const { return str_ < o.str_; }
  bool operator>(const AscendString &o) const { return str_ > o.str_; }
  bool operator==(const AscendString &o) const { return str_ == o.str_; }
  bool operator!=(const AscendString &o) const { return str_ != o.str_; }
  bool operator<=(const AscendString &o) const { return str_ <= o.str_; }
  bool operator>=(const AscendString &o) const { return str_ >= o.str_; }

 private:
  std::string str_;
};

// Numeric values follow ge's c_types.h; llm_datadist only reads the element size of each.
enum DataType {
  DT_FLOAT = 0,
  DT_FLOAT16 = 1,
  DT_INT8 = 2,
  DT_INT32 = 3,
  DT_UINT8 = 4,
  DT_INT16 = 6,
  DT_UINT16 = 7,
  DT_UINT32 = 8,
  DT_INT64 = 9,
  DT_UINT64 = 10,
  DT_DOUBLE = 11,
  DT_BOOL = 12,
  DT_STRING = 13,
  DT_DUAL_SUB_INT8 = 14,
  DT_DUAL_SUB_UINT8 = 15,
  DT_COMPLEX64 = 16,
  DT_COMPLEX128 = 17,
  DT_QINT8 = 18,
  DT_QINT16 = 19,
  DT_QINT32 = 20,
  DT_QUINT8 = 21,
  DT_QUINT16 = 22,
  DT_RESOURCE = 23,
  DT_STRING_REF = 24,
  DT_DUAL = 25,
  DT_VARIANT = 26,
  DT_BF16 = 27,
  DT_UNDEFINED = 28,
  DT_INT4 = 29,
  DT_UINT1 = 30,
  DT_INT2 = 31,
  DT_UINT2 = 32,
  DT_COMPLEX32 = 33,
  DT_HIFLOAT8 = 34,
  DT_FLOAT8_E5M2 = 35,
  DT_FLOAT8_E4M3FN = 36,
  DT_FLOAT8_E8M0 = 37,
  DT_FLOAT6_E3M2 = 38,
  DT_FLOAT6_E2M3 = 39,
  DT_FLOAT4_E2M1 = 40,
  DT_FLOAT4_E1M2 = 41,
  DT_HIFLOAT4 = 42,
  DT_MAX
};

}  // namespace ge

#endif  // KVBLOCKS_GE_TYPES_H_
