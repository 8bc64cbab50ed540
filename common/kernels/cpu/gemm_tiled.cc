// Prefill GEMM: y = x * W^T + bias for large M.
//
// BLIS-style blocking, arranged for W in [N, K] layout: a panel of kNc weight rows x kKc columns
// is converted to f32 into a thread-local buffer that stays in L2, then every 4-row slice of x
// (16 KiB, held in L1) is run against all of the panel's 3-row slices by a 4x3 dot-product
// microkernel. The M loop is inside the packing loop, so each weight element is converted once
// per call (per M slice when M is split across threads).

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/simd_util.h"

namespace tandem::kernels::internal {
namespace {

constexpr int kMr = 4;       // x rows per microkernel
constexpr int kNr = 3;       // weight rows per microkernel: 12 accumulators + 3 + 1 = 16 regs
constexpr int64_t kNc = 96;  // weight rows per packed panel (multiple of kNr)
// Columns per panel: 96 x 1024 x 4 B = 384 KiB of the 512 KiB L2. Long enough that the 12
// horizontal sums and stores ending each microkernel call cost little (measured best of
// 256..2048 on Zen 3).
constexpr int64_t kKc = 1024;

// Dot-product microkernel: acc[i][j] accumulates x[i, :kc] . wp[j, :kc] lane-wise and is reduced
// once at the end, so no transpose of W is needed. `wp` rows are zero-padded to a multiple of 8;
// the x tail is read with a mask so nothing past the row is touched.
template <int MR, int NR>
void DotTile(const float* x, int64_t x_stride, const float* wp, int64_t wp_stride, int64_t kc,
             const float* bias, bool accumulate, float* y, int64_t y_stride) {
  __m256 acc[MR][NR];
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) TANDEM_UNROLL
  for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t kc8 = kc & ~int64_t{7};
  auto step = [&](auto load_x, int64_t kk) {
    __m256 wv[NR];
    TANDEM_UNROLL
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(wp + j * wp_stride + kk);
    TANDEM_UNROLL
    for (int i = 0; i < MR; ++i) {
      __m256 xv = load_x(x + i * x_stride + kk);
      TANDEM_UNROLL
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  };
  for (int64_t kk = 0; kk < kc8; kk += 8) {
    step([](const float* p) { return _mm256_loadu_ps(p); }, kk);
  }
  if (kc8 < kc) {
    const __m256i mask = simd::TailMask(kc - kc8);
    step([&](const float* p) { return _mm256_maskload_ps(p, mask); }, kc8);
  }
  TANDEM_UNROLL
  for (int i = 0; i < MR; ++i) {
    alignas(16) float sums[4];
    _mm_store_ps(sums, simd::HorizontalSums<NR>(acc[i]));
    float* yi = y + i * y_stride;
    TANDEM_UNROLL
    for (int j = 0; j < NR; ++j) {
      if (accumulate) {
        yi[j] += sums[j];
      } else {
        yi[j] = sums[j] + (bias ? bias[j] : 0.0f);
      }
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const float*, bool,
                        float*, int64_t);

template <int MR>
constexpr TileFn kTileRow[kNr] = {&DotTile<MR, 1>, &DotTile<MR, 2>, &DotTile<MR, 3>};
// kTiles[mr - 1][nr - 1] handles an mr x nr tile; only edges use the smaller ones.
constexpr const TileFn* kTiles[kMr] = {kTileRow<1>, kTileRow<2>, kTileRow<3>, kTileRow<4>};

// Converts w[n0 : n0+nc, k0 : k0+kc] to f32 rows of `stride` floats, zero-padding each row.
void PackPanel(const WeightMatrix& w, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
               int64_t stride, float* panel) {
  const size_t elem = DTypeSize(w.dtype);
  const char* base = static_cast<const char*>(w.data);
  for (int64_t r = 0; r < nc; ++r) {
    const char* src = base + ((n0 + r) * w.cols + k0) * elem;
    float* dst = panel + r * stride;
    ToFloat(w.dtype, src, dst, kc);
    std::fill(dst + kc, dst + stride, 0.0f);
  }
}

// Thread-local so each worker converts into its own L2-sized buffer without allocating per call.
float* PanelBuffer() {
  thread_local std::vector<float> buffer(kNc * kKc + 8);
  return buffer.data();
}

// Computes y[m0:m1, n0:n1]: the work of one thread share.
void TiledBlock(const float* x, int64_t m0, int64_t m1, int64_t x_stride, const WeightMatrix& w,
                int64_t n0, int64_t n1, const float* bias, float* y, int64_t y_stride) {
  float* panel = PanelBuffer();
  for (int64_t jc = n0; jc < n1; jc += kNc) {
    const int64_t nc = std::min(kNc, n1 - jc);
    for (int64_t pc = 0; pc < w.cols; pc += kKc) {
      const int64_t kc = std::min(kKc, w.cols - pc);
      const int64_t stride = (kc + 7) & ~int64_t{7};
      PackPanel(w, jc, nc, pc, kc, stride, panel);
      const bool accumulate = pc > 0;
      for (int64_t row = m0; row < m1; row += kMr) {
        const int64_t mr = std::min<int64_t>(kMr, m1 - row);
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const int64_t nr = std::min<int64_t>(kNr, nc - jr);
          const float* b = bias ? bias + jc + jr : nullptr;
          kTiles[mr - 1][nr - 1](x + row * x_stride + pc, x_stride, panel + jr * stride, stride, kc,
                                 b, accumulate, y + row * y_stride + jc + jr, y_stride);
        }
      }
    }
  }
}

}  // namespace

void GemmTiled(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
               const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  // Work items are (weight panel, slice of M). Splitting N alone keeps every weight conversion
  // unique; M is split too only when there are too few panels to keep every thread busy.
  const int64_t threads = pool.num_threads();
  const int64_t n_panels = (w.rows + kNc - 1) / kNc;
  int64_t m_parts = 1;
  if (n_panels < 2 * threads) {
    m_parts = std::clamp<int64_t>((2 * threads + n_panels - 1) / n_panels, 1, (m + kMr - 1) / kMr);
  }
  const int64_t m_per_part = ((m + m_parts - 1) / m_parts + kMr - 1) / kMr * kMr;
  pool.ParallelFor(n_panels * m_parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t panel = t / m_parts;
      const int64_t part = t % m_parts;
      const int64_t m0 = part * m_per_part;
      const int64_t m1 = std::min(m, m0 + m_per_part);
      if (m0 >= m1) continue;
      const int64_t n0 = panel * kNc;
      TiledBlock(x, m0, m1, x_stride, w, n0, std::min(w.rows, n0 + kNc), bias, y, y_stride);
    }
  });
}

}  // namespace tandem::kernels::internal
