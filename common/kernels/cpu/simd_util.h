#pragma once

// AVX2 helpers shared by the CPU kernels. Internal to common/kernels/cpu.

#include <immintrin.h>

#include <cstdint>

#include "common/util/dtype.h"

// Fully unrolls the loop that follows. Register-blocked kernels keep accumulators in arrays
// indexed by compile-time loop counters; unless those loops are unrolled (GCC does not at -O2)
// the arrays live on the stack and every FMA goes through memory.
#define TANDEM_UNROLL _Pragma("GCC unroll 16")

namespace tandem::kernels::simd {

// Loads 8 elements of dtype T at `p` as floats. The dtype is a template parameter so the
// conversion inlines into inner loops without a branch.
template <DType T>
inline __m256 Load8(const void* p, int64_t i);

template <>
inline __m256 Load8<DType::kF32>(const void* p, int64_t i) {
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

template <>
inline __m256 Load8<DType::kBF16>(const void* p, int64_t i) {
  __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <>
inline __m256 Load8<DType::kF16>(const void* p, int64_t i) {
  __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  return _mm256_cvtph_ps(h);
}

// Scalar load of element i of dtype T, for tails.
template <DType T>
inline float Load1(const void* p, int64_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::kBF16) {
    return Bf16ToF32(static_cast<const uint16_t*>(p)[i]);
  } else {
    return F16ToF32(static_cast<const uint16_t*>(p)[i]);
  }
}

// Mask whose first n (0..8) lanes are set, for _mm256_maskload_ps / _mm256_maskstore_ps.
inline __m256i TailMask(int64_t n) {
  alignas(32) static const int32_t kBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kBits + 8 - n));
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Returns {sum(a), sum(b), sum(c), sum(d)}: four horizontal sums for the price of about one.
inline __m128 HorizontalSum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 ab = _mm256_hadd_ps(a, b);
  __m256 cd = _mm256_hadd_ps(c, d);
  __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Lanes 0..N-1 hold the horizontal sums of v[0..N-1], for N <= 4.
template <int N>
inline __m128 HorizontalSums(const __m256 (&v)[N]) {
  static_assert(N >= 1 && N <= 4);
  const __m256 z = _mm256_setzero_ps();
  if constexpr (N == 1) {
    return HorizontalSum4(v[0], z, z, z);
  } else if constexpr (N == 2) {
    return HorizontalSum4(v[0], v[1], z, z);
  } else if constexpr (N == 3) {
    return HorizontalSum4(v[0], v[1], v[2], z);
  } else {
    return HorizontalSum4(v[0], v[1], v[2], v[3]);
  }
}

// exp(x) for f32 lanes, Cephes-style: x = n*ln2 + r, exp(r) by a degree-6 polynomial, scaled by
// 2^n. Relative error ~2 ulp over the normal range; underflows to 0 below about -87.3 and
// saturates to +inf above 88.7, so exp(-inf) = 0 as softmax needs.
inline __m256 Exp(__m256 x) {
  const __m256 kHi = _mm256_set1_ps(88.7228394f);
  const __m256 kLo = _mm256_set1_ps(-87.3365479f);
  __m256 too_small = _mm256_cmp_ps(x, kLo, _CMP_LT_OQ);
  __m256 too_big = _mm256_cmp_ps(x, kHi, _CMP_GT_OQ);
  // Operand order makes min/max return x when it is NaN, so NaN propagates.
  x = _mm256_max_ps(kLo, _mm256_min_ps(kHi, x));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // Two-part ln2 keeps r exact to f32 precision.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n in two halves so n = 128 (x near the top of the range) does not overflow the exponent.
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i half = _mm256_srai_epi32(ni, 1);
  __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  result = _mm256_andnot_ps(too_small, result);
  return _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), too_big);
}

}  // namespace tandem::kernels::simd
