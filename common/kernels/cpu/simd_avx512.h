#pragma once

// AVX-512 forms of simd_util.h's helpers, for functions compiled for AVX-512 (TANDEM_AVX512 or a
// superset of its targets); callers check the CPU first.

#include <immintrin.h>

#define TANDEM_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq")))

// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as uninitialized.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace tandem::kernels::simd {

// e^x = p * 2^n: n = round(x / ln 2), p = e^r for the rest r = x - n ln 2 (|r| <= ln 2 / 2),
// simd::Exp's reduction and polynomial on 16 lanes. Exp512 and the attention tiles' exponential
// differ only in how they scale p.
TANDEM_AVX512 inline __m512 ExpMantissa512(__m512 x, __m512& n) {
  n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  return _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

// simd::Exp on 16 lanes: the same operations per lane, so the same bits.
TANDEM_AVX512 inline __m512 Exp512(__m512 x) {
  const __m512 kHi = _mm512_set1_ps(88.7228394f);
  const __m512 kLo = _mm512_set1_ps(-87.3365479f);
  const __mmask16 too_small = _mm512_cmp_ps_mask(x, kLo, _CMP_LT_OQ);
  const __mmask16 too_big = _mm512_cmp_ps_mask(x, kHi, _CMP_GT_OQ);
  x = _mm512_max_ps(kLo, _mm512_min_ps(kHi, x));
  __m512 n;
  const __m512 p = ExpMantissa512(x, n);
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512 s1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
  __m512 result = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  result = _mm512_maskz_mov_ps(static_cast<__mmask16>(~too_small), result);
  return _mm512_mask_blend_ps(too_big, result, _mm512_set1_ps(__builtin_inff()));
}

}  // namespace tandem::kernels::simd

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
