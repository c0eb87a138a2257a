// SPDX-License-Identifier: Apache-2.0
// kvblocks: the ge:: types that CANN's llm_datadist.h re-exports (Status, AscendString, DataType).
#ifndef KVBLOCKS_GE_TYPES_H_
#define KVBLOCKS_GE_TYPES_H_

#include <cstdint>
#include <cstddef>
#include <cstring>

namespace ge {

// CANN encodes statuses as 32-bit unsigned values (see llm_datadist.h for the LLM_* constants).
using Status = uint32_t;

// A small owning string. Like CANN's AscendString it converts implicitly from const char*,
// so `options[OPTION_DEVICE_ID] = "0";` compiles unchanged, and it orders for use as a map key.
//
// ABI-neutral: it holds a heap char array and its length, never a std::string, and every member
// is inline, so its layout and behaviour are the same whatever _GLIBCXX_USE_CXX11_ABI a client is
// built with (CANN's programs use -D_GLIBCXX_USE_CXX11_ABI=0; kvblocks is built with 1). The option
// maps, vectors and structs of llm_datadist.h and hixl/hixl.h hold only such types, so they cross
// the library boundary unchanged. Storage is new[]/delete[] of the one global allocator.
class AscendString {
 public:
  AscendString() noexcept = default;
  AscendString(const char *name) { Assign(name, name == nullptr ? 0U : std::strlen(name)); }  // NOLINT: implicit
  AscendString(const char *name, size_t length) { Assign(name, name == nullptr ? 0U : length); }
  AscendString(const AscendString &o) { Assign(o.data_, o.len_); }
  AscendString(AscendString &&o) noexcept : data_(o.data_), len_(o.len_) {
    o.data_ = nullptr;
    o.len_ = 0U;
  }
  AscendString &operator=(const AscendString &o) {
    if (this != &o) {
      AscendString copy(o);
      Swap(copy);
    }
    return *this;
  }
  AscendString &operator=(AscendString &&o) noexcept {
    if (this != &o) {
      Release();
      data_ = o.data_;
      len_ = o.len_;
      o.data_ = nullptr;
      o.len_ = 0U;
    }
    return *this;
  }
  ~AscendString() { Release(); }

  // Never null: "" when empty. The bytes are followed by a NUL (embedded NULs are kept).
  const char *GetString() const noexcept { return data_ == nullptr ? "" : data_; }
  size_t GetLength() const noexcept { return len_; }

  bool operator<(const AscendString &o) const noexcept { return Compare(o) < 0; }
  bool operator>(const AscendString &o) const noexcept { return Compare(o) > 0; }
  bool operator==(const AscendString &o) const noexcept { return len_ == o.len_ && Compare(o) == 0; }
  bool operator!=(const AscendString &o) const noexcept { return !(*this == o); }
  bool operator<=(const AscendString &o) const noexcept { return Compare(o) <= 0; }
  bool operator>=(const AscendString &o) const noexcept { return Compare(o) >= 0; }

 private:
  void Assign(const char *s, size_t n) {
    if (n == 0U) return;
    data_ = new char[n + 1U];
    std::memcpy(data_, s, n);
    data_[n] = '\0';
    len_ = n;
  }
  void Release() noexcept {
    delete[] data_;
    data_ = nullptr;
    len_ = 0U;
  }
  void Swap(AscendString &o) noexcept {
    char *d = data_;
    data_ = o.data_;
    o.data_ = d;
    const size_t n = len_;
    len_ = o.len_;
    o.len_ = n;
  }
  // Byte-wise, shorter first on a common prefix (as std::string::compare).
  int Compare(const AscendString &o) const noexcept {
    const size_t n = len_ < o.len_ ? len_ : o.len_;
    const int c = n == 0U ? 0 : std::memcmp(data_, o.data_, n);
    if (c != 0) return c;
    return len_ < o.len_ ? -1 : (len_ > o.len_ ? 1 : 0);
  }

  char *data_ = nullptr;
  size_t len_ = 0U;
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
