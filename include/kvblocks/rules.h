// SPDX-License-Identifier: Apache-2.0
// kvblocks: argument rules shared by the C++ runtime and the Cython core, so the two can
// never disagree. Header-only, allocation-free, noexcept: safe to call without the GIL.
#ifndef KVBLOCKS_RULES_H_
#define KVBLOCKS_RULES_H_

#include <cstddef>
#include <cstdint>

namespace kvblocks {

// Bits per element of a ge::DataType value; 0 when the type has no size (e.g. DT_UNDEFINED).
inline int64_t DataTypeBits(int64_t data_type) noexcept {
  static constexpr int16_t kBits[] = {
      32, 16, 8,  32, 8,  0,  16, 16, 32, 64, 64, 64, 8, 128, 8, 8, 64, 128, 8,  16, 32, 8,
      16, 64, 128, 40, 64, 16, 0, 4,  1,  2,  2,  32, 8, 8,   8, 8, 6,  6,   4,  4,  4};
  if (data_type < 0 || data_type >= static_cast<int64_t>(sizeof(kBits) / sizeof(kBits[0]))) return 0;
  return kBits[data_type];
}

// Byte size of one tensor, or -1 when a dimension is <= 0, the rank is outside [1, 32),
// the product overflows int64, or the type has no size.
inline int64_t TensorBytes(int64_t data_type, const int64_t *shape, size_t ndim) noexcept {
  const int64_t bits = DataTypeBits(data_type);
  if (bits == 0 || ndim == 0 || ndim >= 32) return -1;
  int64_t elems = 1;
  for (size_t i = 0; i < ndim; ++i) {
    if (shape[i] <= 0) return -1;
    if (__builtin_mul_overflow(elems, shape[i], &elems)) return -1;
  }
  int64_t total_bits;
  if (__builtin_mul_overflow(elems, bits, &total_bits)) return -1;
  return total_bits / 8 + (total_bits % 8 != 0 ? 1 : 0);
}

// Index of the first value >= limit, or n when every value is in range.
inline size_t FirstOutOfRange(const uint64_t *values, size_t n, uint64_t limit) noexcept {
  // Branch-free OR-reduction over chunks keeps the common (valid) case vectorisable.
  constexpr size_t kChunk = 256;
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t end = base + kChunk < n ? base + kChunk : n;
    uint64_t bad = 0;
    for (size_t i = base; i < end; ++i) bad |= static_cast<uint64_t>(values[i] >= limit);
    if (bad != 0) {
      for (size_t i = base; i < end; ++i)
        if (values[i] >= limit) return i;
    }
  }
  return n;
}

// An inclusive C++ layer range is valid when both ends are >= -1 and first <= second.
inline bool LayerRangeValid(int32_t first, int32_t second) noexcept {
  return first >= -1 && second >= -1 && first <= second;
}

// Tensor selection of a transfer: tensors [src_begin, src_begin + count) map to
// [dst_begin, dst_begin + count).
struct TensorSpan {
  uint32_t src_begin = 0;
  uint32_t dst_begin = 0;
  uint32_t count = 0;
};

enum class RuleError : int { kOk = 0, kParamInvalid = 1 };

// Pull: explicit ranges apply only when both firsts are >= 0 (CANN V2). `local_tensors` is the
// destination's tensor count; the source side is checked later against the peer's table.
// With no explicit range, src_begin = dst_begin = 0 and count = local_tensors.
inline RuleError PullTensorSpan(int32_t src_first, int32_t src_second, int32_t dst_first, int32_t dst_second,
                                uint32_t tnpl, uint32_t local_tensors, bool *explicit_range,
                                TensorSpan *span) noexcept {
  if (!LayerRangeValid(src_first, src_second) || !LayerRangeValid(dst_first, dst_second) || tnpl == 0)
    return RuleError::kParamInvalid;
  *explicit_range = src_first >= 0 && dst_first >= 0;
  if (!*explicit_range) {
    *span = TensorSpan{0, 0, local_tensors};
    return RuleError::kOk;
  }
  if (local_tensors % tnpl != 0) return RuleError::kParamInvalid;
  const uint64_t src_begin = static_cast<uint64_t>(src_first) * tnpl;
  const uint64_t src_end = (static_cast<uint64_t>(src_second) + 1) * tnpl;
  const uint64_t dst_begin = static_cast<uint64_t>(dst_first) * tnpl;
  const uint64_t dst_end = (static_cast<uint64_t>(dst_second) + 1) * tnpl;
  if (dst_end > local_tensors) return RuleError::kParamInvalid;
  if (src_end - src_begin != dst_end - dst_begin) return RuleError::kParamInvalid;
  if (src_end > UINT32_MAX) return RuleError::kParamInvalid;
  *span = TensorSpan{static_cast<uint32_t>(src_begin), static_cast<uint32_t>(dst_begin),
                     static_cast<uint32_t>(dst_end - dst_begin)};
  return RuleError::kOk;
}

// Push: ranges must be valid and of equal width; {-1,..} on the source means every layer of a
// cache with `desc_tensors` (caller-filled) tensors, which must then be > 0.
inline RuleError PushRangesValid(int32_t src_first, int32_t src_second, int32_t dst_first, int32_t dst_second,
                                 uint32_t desc_tensors) noexcept {
  if (!LayerRangeValid(src_first, src_second) || !LayerRangeValid(dst_first, dst_second))
    return RuleError::kParamInvalid;
  if (static_cast<int64_t>(src_second) - src_first != static_cast<int64_t>(dst_second) - dst_first)
    return RuleError::kParamInvalid;
  if (src_first < 0 && desc_tensors == 0) return RuleError::kParamInvalid;
  return RuleError::kOk;
}

// Push layer pairing: with src_first == -1 every local layer l goes to remote layer l; otherwise
// src layer src_first + i goes to dst layer dst_first + i. Layers must exist on both sides and
// tnpl must divide the local tensor count. Writes the whole selection as one tensor span.
inline RuleError PushTensorSpan(int32_t src_first, int32_t src_second, int32_t dst_first, uint32_t tnpl,
                                uint32_t local_tensors, uint32_t remote_tensors, TensorSpan *span) noexcept {
  if (tnpl == 0) return RuleError::kParamInvalid;
  int64_t s0, s1, d0;
  if (src_first < 0) {
    if (local_tensors < tnpl) return RuleError::kParamInvalid;
    s0 = 0;
    s1 = static_cast<int64_t>(local_tensors / tnpl) - 1 + (local_tensors % tnpl != 0 ? 1 : 0);
    d0 = 0;
  } else {
    s0 = src_first;
    s1 = src_second;
    d0 = dst_first;
  }
  const int64_t n = s1 - s0 + 1;
  if (d0 < 0 || d0 + n > static_cast<int64_t>(remote_tensors / tnpl)) return RuleError::kParamInvalid;
  if (s1 >= static_cast<int64_t>(local_tensors / tnpl)) return RuleError::kParamInvalid;
  if (local_tensors % tnpl != 0) return RuleError::kParamInvalid;
  *span = TensorSpan{static_cast<uint32_t>(s0 * tnpl), static_cast<uint32_t>(d0 * tnpl),
                     static_cast<uint32_t>(n * tnpl)};
  return RuleError::kOk;
}

}  // namespace kvblocks

#endif  // KVBLOCKS_RULES_H_
