#include "common/kernels/cpu/gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels {
namespace {

using simd::Load1;
using simd::Load8;

// Up to this many rows of x, weights are streamed straight from memory (GEMV); beyond it the
// weight panel is converted to f32 once and reused by a register-blocked kernel.
constexpr int64_t kDecodeMaxM = 16;

// ---------------------------------------------------------------------------------------------
// Decode: NR weight rows x MR rows of x per tile, each weight element converted once per tile.
// ---------------------------------------------------------------------------------------------

constexpr int kGemvRows = 4;  // weight rows per tile: 4 independent streams and FMA chains
// Bytes ahead to prefetch in each weight row; covers DRAM latency at ~20 GB/s per core.
constexpr int64_t kPrefetchBytes = 1024;

template <DType T, int MR, int NR>
void GemvTile(const float* x, int64_t x_stride, const char* w_row0, int64_t row_bytes, int64_t k,
              const float* bias, float* y, int64_t y_stride) {
  const char* rows[NR];
  TANDEM_UNROLL
  for (int j = 0; j < NR; ++j) rows[j] = w_row0 + j * row_bytes;
  __m256 acc[MR][NR];
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  auto step = [&](int64_t kk) {
    __m256 wv[NR];
    TANDEM_UNROLL
    for (int j = 0; j < NR; ++j) wv[j] = Load8<T>(rows[j], kk);
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * x_stride + kk);
      TANDEM_UNROLL
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
    }
  };
  // 32 elements (one 64-byte line of bf16/f16, two of f32) per iteration, one prefetch per line.
  constexpr int64_t kElem = T == DType::kF32 ? 4 : 2;
  int64_t kk = 0;
  for (; kk + 32 <= k; kk += 32) {
    TANDEM_UNROLL
    for (int j = 0; j < NR; ++j) {
      TANDEM_UNROLL
      for (int64_t b = 0; b < 32 * kElem; b += 64) {
        _mm_prefetch(rows[j] + kk * kElem + b + kPrefetchBytes, _MM_HINT_T0);
      }
    }
    step(kk);
    step(kk + 8);
    step(kk + 16);
    step(kk + 24);
  }
  for (; kk + 8 <= k; kk += 8) step(kk);
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) {
    alignas(16) float sums[4];
    _mm_store_ps(sums, simd::HorizontalSums<NR>(acc[i]));
    for (int j = 0; j < NR; ++j) {
      float s = sums[j];
      for (int64_t t = kk; t < k; ++t) s += x[i * x_stride + t] * Load1<T>(rows[j], t);
      y[i * y_stride + j] = s + (bias ? bias[j] : 0.0f);
    }
  }
}

// One tile of NR weight rows against all m rows of x, two rows of x per pass (2x4 accumulators
// + 4 weights + 1 x fit the 16 registers). The tile (a few KiB to a few tens of KiB) stays in
// L1/L2 between passes, so memory sees each weight once.
template <DType T, int NR>
void GemvRows(const float* x, int64_t m, int64_t x_stride, const char* w_row0, int64_t row_bytes,
              int64_t k, const float* bias, float* y, int64_t y_stride) {
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) {
    GemvTile<T, 2, NR>(x + i * x_stride, x_stride, w_row0, row_bytes, k, bias, y + i * y_stride,
                       y_stride);
  }
  if (i < m) {
    GemvTile<T, 1, NR>(x + i * x_stride, x_stride, w_row0, row_bytes, k, bias, y + i * y_stride,
                       y_stride);
  }
}

template <DType T>
void GemvRange(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
               const float* bias, float* y, int64_t y_stride, int64_t n_begin, int64_t n_end) {
  const int64_t row_bytes = w.cols * static_cast<int64_t>(DTypeSize(w.dtype));
  const char* base = static_cast<const char*>(w.data);
  int64_t n = n_begin;
  for (; n + kGemvRows <= n_end; n += kGemvRows) {
    GemvRows<T, kGemvRows>(x, m, x_stride, base + n * row_bytes, row_bytes, w.cols,
                           bias ? bias + n : nullptr, y + n, y_stride);
  }
  for (; n < n_end; ++n) {
    GemvRows<T, 1>(x, m, x_stride, base + n * row_bytes, row_bytes, w.cols,
                   bias ? bias + n : nullptr, y + n, y_stride);
  }
}

}  // namespace

namespace internal {

void GemmStreaming(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
                   const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  const int64_t groups = (w.rows + kGemvRows - 1) / kGemvRows;
  // Each share should stream at least ~256 KiB of weights, or thread wake-up dominates.
  const int64_t grain = std::max<int64_t>(1, (256 << 10) / (kGemvRows * 2 * w.cols + 1));
  pool.ParallelFor(groups, grain, [&](int64_t g0, int64_t g1) {
    const int64_t n0 = g0 * kGemvRows;
    const int64_t n1 = std::min(w.rows, g1 * kGemvRows);
    switch (w.dtype) {
      case DType::kF32:
        return GemvRange<DType::kF32>(x, m, x_stride, w, bias, y, y_stride, n0, n1);
      case DType::kF16:
        return GemvRange<DType::kF16>(x, m, x_stride, w, bias, y, y_stride, n0, n1);
      case DType::kBF16:
        return GemvRange<DType::kBF16>(x, m, x_stride, w, bias, y, y_stride, n0, n1);
    }
  });
}

}  // namespace internal

void Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w, const float* bias,
          float* y, int64_t y_stride, ThreadPool& pool) {
  if (m <= 0 || w.rows <= 0) return;
  if (w.cols == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t n = 0; n < w.rows; ++n) y[i * y_stride + n] = bias ? bias[n] : 0.0f;
    return;
  }
  if (m <= kDecodeMaxM) {
    internal::GemmStreaming(x, m, x_stride, w, bias, y, y_stride, pool);
  } else {
    internal::GemmTiled(x, m, x_stride, w, bias, y, y_stride, pool);
  }
}

}  // namespace tandem::kernels
