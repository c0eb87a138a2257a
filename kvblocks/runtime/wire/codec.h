// SPDX-License-Identifier: Apache-2.0
// Little-endian field codec for wire messages. Reader never reads past its buffer: a short or
// malformed message only clears `ok`.
#ifndef KVBLOCKS_RUNTIME_WIRE_CODEC_H_
#define KVBLOCKS_RUNTIME_WIRE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace kvblocks {

template <typename T>
inline T ToLittle(T v) {
  static_assert(std::is_integral<T>::value, "integers only");
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  if (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
  if (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
#endif
  return v;
}

struct Writer {
  std::string buf;
  template <typename T>
  void Put(T v) {
    v = ToLittle(v);
    buf.append(reinterpret_cast<const char *>(&v), sizeof(T));
  }
  void PutBytes(const void *p, size_t n) { buf.append(reinterpret_cast<const char *>(p), n); }
};

struct Reader {
  const uint8_t *p;
  size_t n;
  size_t off = 0;
  bool ok = true;
  Reader(const uint8_t *data, size_t size) : p(data), n(size) {}
  explicit Reader(const std::string &s) : p(reinterpret_cast<const uint8_t *>(s.data())), n(s.size()) {}
  template <typename T>
  T Get() {
    T v{};
    if (!ok || sizeof(T) > n - off) {
      ok = false;
      return v;
    }
    memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return ToLittle(v);
  }
  bool GetBytes(void *out, size_t k) {
    if (!ok || k > n - off) return ok = false;
    memcpy(out, p + off, k);
    off += k;
    return true;
  }
  bool Skip(size_t k) {
    if (!ok || k > n - off) return ok = false;
    off += k;
    return true;
  }
  size_t left() const { return n - off; }
  bool done() const { return ok && off == n; }  // everything consumed, nothing malformed
};

}  // namespace kvblocks

#endif  // KVBLOCKS_RUNTIME_WIRE_CODEC_H_
