#include "common/kernels/cpu/elementwise.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels {
namespace {

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
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
  }
  float sum = simd::HorizontalSum(
      _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
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

void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float mean = SumOfSquares(xr, dim) / static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(mean + eps);
    const __m256 inv_v = _mm256_set1_ps(inv);
    int64_t i = 0;
    // Same order as Hugging Face: (x * rsqrt) * weight.
    for (; i + 8 <= dim; i += 8) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), inv_v);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = (xr[i] * inv) * weight[i];
  }
}

void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * dim;
    const float* u = g + dim;
    float* o = out + r * dim;
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      __m256 gv = _mm256_loadu_ps(g + i);
      __m256 denom = _mm256_add_ps(one, simd::Exp(_mm256_xor_ps(gv, sign)));
      __m256 silu = _mm256_div_ps(gv, denom);
      _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < dim; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void AddInPlace(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  for (; i < n; ++i) y[i] += x[i];
}

void ApplyRope(float* x, int num_heads, int head_dim, int64_t pos, const float* inv_freq) {
  const int half = head_dim / 2;
  if (half == 0) return;
  const RopeTable& t = RopeAngles(pos, inv_freq, half);
  const float* c = t.cos.data();
  const float* s = t.sin.data();
  for (int h = 0; h < num_heads; ++h) {
    float* lo = x + static_cast<int64_t>(h) * head_dim;
    float* hi = lo + half;
    int j = 0;
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
