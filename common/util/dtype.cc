#include "common/util/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// FromFloat's bf16 rounding (below) on 16 values at a time where the CPU has AVX-512BW: the same
// integer operations, so the same codes. Returns how many values it converted (a multiple of 16).
__attribute__((target("avx512f,avx512bw"))) size_t ToBf16Wide(const float* src, uint16_t* d,
                                                              size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = _mm512_loadu_si512(src + i);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs_mask), inf);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(half, _mm512_and_si512(high, one))), 16);
    const __m512i codes = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, quiet));
    // Codes are below 2^16: the truncating narrow keeps them.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtepi32_epi16(codes));
  }
  return i;
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool CpuHasAvx512Bw() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}

}  // namespace

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
      // F32ToBf16 on 8 values at a time, in integer arithmetic (the same bits, NaN included).
      auto* d = static_cast<uint16_t*>(dst);
      const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
      const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
      const __m256i quiet = _mm256_set1_epi32(0x40);
      size_t i = CpuHasAvx512Bw() ? ToBf16Wide(src, d, n) : 0;
      for (; i + 8 <= n; i += 8) {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
        const __m256i high = _mm256_srli_epi32(bits, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(bits, _mm256_add_epi32(half, _mm256_and_si256(high, one))), 16);
        const __m256i codes = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
        // Codes are below 2^16, so the saturating pack keeps them; it packs within 128-bit lanes.
        const __m256i packed = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(codes, _mm256_setzero_si256()), 0b11011000);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
      }
      for (; i < n; ++i) d[i] = F32ToBf16(src[i]);
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
