#include "common/kernels/cpu/elementwise.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/simd_avx512.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels {
namespace {

// The sum of squares in AVX2's lanes and order: 4 accumulators of 8 lanes over each 32 floats,
// then 8 floats at a time into the first, then the scalar rest. SumOfSquares512 holds the same
// accumulators two to a register, so both give the same bits. Not inlined: one compiled copy of
// the tails for both, as the compiler may contract or schedule an inlined copy differently.
__attribute__((noinline)) float SumOfSquaresFrom(__m256 (&acc)[4], const float* x, int64_t i,
                                                 int64_t n) {
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
  }
  float sum = simd::HorizontalSum(
      _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

float SumOfSquares(const float* x, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int u = 0; u < 4; ++u) {
      __m256 v = _mm256_loadu_ps(x + i + 8 * u);
      acc[u] = _mm256_fmadd_ps(v, v, acc[u]);
    }
  }
  return SumOfSquaresFrom(acc, x, i, n);
}

TANDEM_AVX512 float SumOfSquares512(const float* x, int64_t n) {
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();  // acc[0] | acc[1], acc[2] | acc[3]
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    lo = _mm512_fmadd_ps(a, a, lo);
    hi = _mm512_fmadd_ps(b, b, hi);
  }
  __m256 acc[4] = {_mm512_extractf32x8_ps(lo, 0), _mm512_extractf32x8_ps(lo, 1),
                   _mm512_extractf32x8_ps(hi, 0), _mm512_extractf32x8_ps(hi, 1)};
  return SumOfSquaresFrom(acc, x, i, n);
}

// The element-wise loops below do their first floor(n / 16) * 16 elements 16 at a time on
// AVX-512 and return where they stopped; the AVX2 loop that follows does the rest, 8 at a time
// then one at a time, as it does all of them without AVX-512. Each element takes the same
// operations either way.

TANDEM_AVX512 int64_t ScaleRow512(const float* x, const float* weight, float inv, int64_t n,
                                  float* y) {
  const __m512 inv_v = _mm512_set1_ps(inv);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), inv_v);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(v, _mm512_loadu_ps(weight + i)));
  }
  return i;
}

TANDEM_AVX512 int64_t SiluMulRow512(const float* g, const float* u, int64_t n, float* o) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), sign));
    const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, simd::Exp512(neg)));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
  }
  return i;
}

TANDEM_AVX512 int64_t Add512(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  }
  return i;
}

TANDEM_AVX512 int RotateHead512(float* lo, float* hi, const float* c, const float* s, int half) {
  int j = 0;
  for (; j + 16 <= half; j += 16) {
    const __m512 a = _mm512_loadu_ps(lo + j), b = _mm512_loadu_ps(hi + j);
    const __m512 cv = _mm512_loadu_ps(c + j), sv = _mm512_loadu_ps(s + j);
    _mm512_storeu_ps(lo + j, _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv)));
    _mm512_storeu_ps(hi + j, _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv)));
  }
  return j;
}

// cos/sin of pos * inv_freq[j], cached per thread: the q and k projections of a token (and
// every layer) rotate by the same angles, and the angles need double precision, which is slow.
struct RopeTable {
  int64_t pos = -1;
  std::vector<float> inv_freq;  // the values the table was built for, compared on lookup
  std::vector<float> cos;
  std::vector<float> sin;
};

const RopeTable& RopeAngles(int64_t pos, const float* inv_freq, int half) {
  thread_local RopeTable table;
  const size_t bytes = sizeof(float) * half;
  if (table.pos == pos && table.inv_freq.size() == static_cast<size_t>(half) &&
      std::memcmp(table.inv_freq.data(), inv_freq, bytes) == 0) {
    return table;
  }
  table.pos = pos;
  table.inv_freq.assign(inv_freq, inv_freq + half);
  table.cos.resize(half);
  table.sin.resize(half);
  for (int j = 0; j < half; ++j) {
    // A float angle loses ~pos * 2^-24 rad (0.008 at 131072); double keeps it exact enough.
    const double a = static_cast<double>(pos) * static_cast<double>(inv_freq[j]);
    table.cos[j] = static_cast<float>(std::cos(a));
    table.sin[j] = static_cast<float>(std::sin(a));
  }
  return table;
}

}  // namespace

VectorIsa BestVectorIsa() {
  static const bool avx512 = __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512dq");
  return avx512 ? VectorIsa::kAvx512 : VectorIsa::kAvx2;
}

void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim, float* y,
             VectorIsa isa) {
  const bool wide = isa == VectorIsa::kAvx512;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float mean =
        (wide ? SumOfSquares512(xr, dim) : SumOfSquares(xr, dim)) / static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(mean + eps);
    int64_t i = wide ? ScaleRow512(xr, weight, inv, dim, yr) : 0;
    const __m256 inv_v = _mm256_set1_ps(inv);
    // Same order as Hugging Face: (x * rsqrt) * weight.
    for (; i + 8 <= dim; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv_v);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = (xr[i] * inv) * weight[i];
  }
}

void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out, VectorIsa isa) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * dim;
    const float* u = g + dim;
    float* o = out + r * dim;
    int64_t i = isa == VectorIsa::kAvx512 ? SiluMulRow512(g, u, dim, o) : 0;
    for (; i + 8 <= dim; i += 8) {
      __m256 gv = _mm256_loadu_ps(g + i);
      __m256 denom = _mm256_add_ps(one, simd::Exp(_mm256_xor_ps(gv, sign)));
      __m256 silu = _mm256_div_ps(gv, denom);
      _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < dim; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void AddInPlace(float* y, const float* x, int64_t n, VectorIsa isa) {
  int64_t i = isa == VectorIsa::kAvx512 ? Add512(y, x, n) : 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) y[i] += x[i];
}

void ApplyRope(float* x, int num_heads, int head_dim, int64_t pos, const float* inv_freq,
               VectorIsa isa) {
  const int half = head_dim / 2;
  if (half == 0) return;
  const RopeTable& t = RopeAngles(pos, inv_freq, half);
  const float* c = t.cos.data();
  const float* s = t.sin.data();
  for (int h = 0; h < num_heads; ++h) {
    float* lo = x + static_cast<int64_t>(h) * head_dim;
    float* hi = lo + half;
    int j = isa == VectorIsa::kAvx512 ? RotateHead512(lo, hi, c, s, half) : 0;
    for (; j + 8 <= half; j += 8) {
      __m256 a = _mm256_loadu_ps(lo + j);
      __m256 b = _mm256_loadu_ps(hi + j);
      __m256 cv = _mm256_loadu_ps(c + j);
      __m256 sv = _mm256_loadu_ps(s + j);
      _mm256_storeu_ps(lo + j, _mm256_fmsub_ps(a, cv, _mm256_mul_ps(b, sv)));
      _mm256_storeu_ps(hi + j, _mm256_fmadd_ps(b, cv, _mm256_mul_ps(a, sv)));
    }
    for (; j < half; ++j) {
      const float a = lo[j];
      const float b = hi[j];
      lo[j] = a * c[j] - b * s[j];
      hi[j] = b * c[j] + a * s[j];
    }
  }
}

}  // namespace tandem::kernels
