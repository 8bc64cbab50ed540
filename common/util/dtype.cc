#include "common/util/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "int8";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  std::string n = absl::AsciiStrToLower(std::string(name));
  if (n == "fp32" || n == "f32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "fp16" || n == "f16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name), "' (expected fp32, fp16 or bf16)"));
}

absl::StatusOr<DType> ParseKvDType(std::string_view name) {
  std::string n = absl::AsciiStrToLower(std::string(name));
  if (n == "int8" || n == "i8") return DType::kI8;
  if (auto t = ParseDType(name); t.ok()) return t;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV dtype '", std::string(name),
                                                 "' (expected fp32, fp16, bf16 or int8)"));
}

float F16ToF32(uint16_t h) { return _cvtsh_ss(h); }

uint16_t F32ToF16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

void ToFloat(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      }
      for (; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
      }
      for (; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
  }
}

void FromFloat(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
      }
      for (; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kI8: {
      auto* d = static_cast<int8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = RoundToI8(src[i]);
      return;
    }
  }
}

}  // namespace tandem
