#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

// Element types of weights and KV-cache blocks. kI8 is for KV blocks only: int8 values with an
// fp16 scale per row (one token of one head), laid out by kv::KvLayout.
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3 };

constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : t == DType::kI8 ? 1 : 2; }

// Lower-case name as used on the command line and in configs: "fp32", "fp16", "bf16", "int8".
std::string_view DTypeName(DType t);

// A floating-point storage type: "fp32|f32|float32|float", "fp16|f16|float16|half",
// "bf16|bfloat16".
absl::StatusOr<DType> ParseDType(std::string_view name);

// A KV-cache element type: ParseDType's, or "int8|i8".
absl::StatusOr<DType> ParseKvDType(std::string_view name);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// x rounded to the nearest integer (ties to even) and saturated to [-127, 127]; NaN gives 0.
inline int8_t RoundToI8(float x) {
  const float r = std::nearbyint(x);
  return static_cast<int8_t>(r >= 127.0f ? 127.0f : r <= -127.0f ? -127.0f : r == r ? r : 0);
}

// IEEE binary16 conversions (scalar; kernels use F16C).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Converts n elements of `src` (type `t`) to float. kI8 elements convert unscaled.
void ToFloat(DType t, const void* src, float* dst, size_t n);
// Converts n floats to type `t`; kI8 rounds and saturates to [-127, 127], unscaled.
void FromFloat(DType t, const float* src, void* dst, size_t n);

}  // namespace tandem
