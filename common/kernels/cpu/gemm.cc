#include "common/kernels/cpu/gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/kernels/cpu/gemm_internal.h"
#include "common/kernels/cpu/int8_tiles.h"
#include "common/kernels/cpu/onednn_gemm.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/kernels/cpu/simd_util.h"
#include "common/util/check.h"

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
// Rows up to this long prefetch a whole tile ahead instead (see GemvTile).
constexpr int64_t kShortRowBytes = 4096;

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
  // Long rows prefetch kPrefetchBytes ahead in the same row; short rows (small models) would
  // run off their end within a few lines, so they prefetch the same spot of the next tile,
  // which the tile's rows reach in order since W is row-major.
  constexpr int64_t kElem = T == DType::kF32 ? 4 : 2;
  const int64_t ahead = row_bytes <= kShortRowBytes ? NR * row_bytes : kPrefetchBytes;
  int64_t kk = 0;
  for (; kk + 32 <= k; kk += 32) {
    TANDEM_UNROLL
    for (int j = 0; j < NR; ++j) {
      TANDEM_UNROLL
      for (int64_t b = 0; b < 32 * kElem; b += 64) {
        _mm_prefetch(rows[j] + kk * kElem + b + ahead, _MM_HINT_T0);
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

void ForEachSlice(std::span<const GemmOutput> outputs, int64_t m, int64_t slice_rows,
                  int64_t chunk_rows, int64_t unit_chunks, bool split_rows, ThreadPool& pool,
                  const SliceFn& fn) {
  int64_t slices = 0;
  for (const auto& o : outputs) slices += (o.w.rows + slice_rows - 1) / slice_rows;
  const int64_t chunks = (m + chunk_rows - 1) / chunk_rows;
  const int64_t threads = pool.num_threads();
  const int64_t parts = !split_rows || slices >= 2 * threads
                            ? 1
                            : std::clamp<int64_t>((2 * threads + slices - 1) / slices, 1, chunks);
  const int64_t units = ((chunks + parts - 1) / parts + unit_chunks - 1) / unit_chunks;
  const int64_t rows_per_part = units * unit_chunks * chunk_rows;
  pool.ParallelForDynamic(slices * parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t slice = t / parts;
      const int64_t r0 = t % parts * rows_per_part, r1 = std::min(m, r0 + rows_per_part);
      for (const auto& o : outputs) {
        const int64_t count = (o.w.rows + slice_rows - 1) / slice_rows;
        if (slice >= count) {
          slice -= count;
          continue;
        }
        if (r0 < r1) fn(o, slice, r0, r1);
        break;
      }
    }
  });
}

namespace {

// Slice `index` of the outputs' slices in order: its output and its index there.
std::pair<const GemmOutput*, int64_t> SliceAt(std::span<const GemmOutput> outputs,
                                              int64_t slice_rows, int64_t index) {
  for (const GemmOutput& o : outputs) {
    const int64_t count = (o.w.rows + slice_rows - 1) / slice_rows;
    if (index < count) return {&o, index};
    index -= count;
  }
  TANDEM_CHECK(false, "a slice past the outputs' last");
  return {nullptr, 0};
}

}  // namespace

void ForEachRowBlockSlice(std::span<const GemmOutput> outputs, int64_t m, int64_t slice_rows,
                          int64_t unit, int64_t max_block_rows, ThreadPool& pool,
                          const RowBlockFn& fn) {
  int64_t slices = 0;
  for (const GemmOutput& o : outputs) slices += (o.w.rows + slice_rows - 1) / slice_rows;
  const int64_t most = std::max(unit, max_block_rows / unit * unit);
  const int64_t row_blocks =
      std::max((m + most - 1) / most, (2 * pool.num_threads() + slices - 1) / slices);
  const int64_t block_rows = (m + row_blocks - 1) / row_blocks;
  const int64_t rows = (block_rows + unit - 1) / unit * unit;
  pool.ParallelForDynamic((m + rows - 1) / rows * slices, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t / slices * rows;
      const std::pair<const GemmOutput*, int64_t> at = SliceAt(outputs, slice_rows, t % slices);
      const std::pair<const GemmOutput*, int64_t> next =
          SliceAt(outputs, slice_rows, (t + 1) % slices);
      fn(*at.first, at.second, r0, std::min(m, r0 + rows), *next.first, next.second);
    }
  });
}

void GemmStreaming(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
                   const float* bias, float* y, int64_t y_stride, ThreadPool& pool) {
  const GemmOutput out{w, bias, y, y_stride};
  GemmStreamingMulti(x, m, x_stride, {&out, 1}, pool);
}

void GemmStreamingMulti(const float* x, int64_t m, int64_t x_stride,
                        std::span<const GemmOutput> outputs, ThreadPool& pool) {
  // Groups of kGemvRows weight rows, numbered across all outputs in order.
  int64_t total_groups = 0, cols = 0;
  for (const auto& o : outputs) {
    total_groups += (o.w.rows + kGemvRows - 1) / kGemvRows;
    cols = o.w.cols;
  }
  // A chunk streams ~256 KiB of weights: long enough that taking one costs nothing, short
  // enough that a thread slowed by a noisy neighbour leaves little work at the barrier.
  const int64_t chunk = std::max<int64_t>(1, (256 << 10) / (kGemvRows * 2 * cols + 1));
  pool.ParallelForDynamic(total_groups, chunk, [&](int64_t g0, int64_t g1) {
    int64_t first = 0;  // global index of the current output's first group
    for (const auto& o : outputs) {
      const int64_t groups = (o.w.rows + kGemvRows - 1) / kGemvRows;
      const int64_t b = std::max(g0, first) - first, e = std::min(g1, first + groups) - first;
      first += groups;
      if (b >= e) continue;
      const int64_t n0 = b * kGemvRows, n1 = std::min(o.w.rows, e * kGemvRows);
      switch (o.w.dtype) {
        case DType::kF32:
          GemvRange<DType::kF32>(x, m, x_stride, o.w, o.bias, o.y, o.y_stride, n0, n1);
          break;
        case DType::kF16:
          GemvRange<DType::kF16>(x, m, x_stride, o.w, o.bias, o.y, o.y_stride, n0, n1);
          break;
        case DType::kBF16:
          GemvRange<DType::kBF16>(x, m, x_stride, o.w, o.bias, o.y, o.y_stride, n0, n1);
          break;
        case DType::kI8:  // KV only: the loader refuses weights in any dtype but f32/f16/bf16
          break;
      }
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
  if (w.layout == WeightLayout::kOnednn) {
    const GemmOutput out{w, bias, y, y_stride};
    internal::GemmOnednn(x, m, x_stride, {&out, 1}, pool);
  } else if (w.layout == WeightLayout::kInt8Tiles) {
    const GemmOutput out{w, bias, y, y_stride};
    internal::GemmInt8Tiles(x, m, x_stride, {&out, 1}, pool);
  } else if (w.layout == WeightLayout::kRowMajor && m <= kDecodeMaxM) {
    internal::GemmStreaming(x, m, x_stride, w, bias, y, y_stride, pool);
  } else {
    internal::GemmTiled(x, m, x_stride, w, bias, y, y_stride, pool);
  }
}

}  // namespace tandem::kernels

namespace tandem::kernels {

void GemmMulti(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
               ThreadPool& pool) {
  if (m <= 0) return;
  bool all_streamable = m <= kDecodeMaxM, all_panels = true, all_onednn = true,
       all_int8_tiles = true;
  for (const auto& o : outputs) {
    all_streamable &= o.w.rows > 0 && o.w.cols > 0 && o.w.layout == WeightLayout::kRowMajor;
    all_panels &= o.w.layout == WeightLayout::kPanels || o.w.layout == WeightLayout::kQuantPanels;
    // One plan (dtype and input columns) for all: they share one converted x.
    all_onednn &= o.w.layout == WeightLayout::kOnednn && o.w.dtype == outputs.front().w.dtype;
    // (one x rounded to int8 for all)
    all_int8_tiles &= o.w.layout == WeightLayout::kInt8Tiles;
  }
  if (all_streamable) return internal::GemmStreamingMulti(x, m, x_stride, outputs, pool);
  if (all_panels) return internal::GemmTiledMulti(x, m, x_stride, outputs, pool);
  if (all_onednn) return internal::GemmOnednn(x, m, x_stride, outputs, pool);
  if (all_int8_tiles) return internal::GemmInt8Tiles(x, m, x_stride, outputs, pool);
  for (const auto& o : outputs) Gemm(x, m, x_stride, o.w, o.bias, o.y, o.y_stride, pool);
}

namespace {

// Position of row r (0..15) within a packed column of dtype `dtype` (see WeightLayout::kPanels).
int64_t PanelPosition(DType dtype, int64_t r) {
  if (dtype != DType::kBF16) return r;
  return r < kPanelRows / 2 ? 2 * r : 2 * (r - kPanelRows / 2) + 1;
}

template <typename E>
void PackPanelRange(const WeightMatrix& w, E* out, int64_t p0, int64_t p1) {
  const E* in = static_cast<const E*>(w.data);
  for (int64_t p = p0; p < p1; ++p) {
    E* panel = out + p * w.cols * kPanelRows;
    for (int64_t r = 0; r < kPanelRows; ++r) {
      const int64_t row = p * kPanelRows + r, pos = PanelPosition(w.dtype, r);
      const E* src = row < w.rows ? in + row * w.cols : nullptr;
      for (int64_t k = 0; k < w.cols; ++k) panel[k * kPanelRows + pos] = src ? src[k] : E{0};
    }
  }
}

}  // namespace

int64_t PanelBytes(DType dtype, int64_t rows, int64_t cols) {
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  return panels * kPanelRows * cols * static_cast<int64_t>(DTypeSize(dtype));
}

WeightMatrix PackPanels(const WeightMatrix& w, void* out, ThreadPool& pool) {
  const int64_t panels = (w.rows + kPanelRows - 1) / kPanelRows;
  pool.ParallelFor(panels, 1, [&](int64_t p0, int64_t p1) {
    if (w.dtype == DType::kF32) {
      PackPanelRange(w, static_cast<uint32_t*>(out), p0, p1);
    } else {
      PackPanelRange(w, static_cast<uint16_t*>(out), p0, p1);
    }
  });
  return WeightMatrix{out, w.dtype, w.rows, w.cols, WeightLayout::kPanels};
}

int64_t MatrixBytes(const WeightMatrix& w) {
  switch (w.layout) {
    case WeightLayout::kRowMajor:
      return w.rows * w.cols * static_cast<int64_t>(DTypeSize(w.dtype));
    case WeightLayout::kPanels:
      return PanelBytes(w.dtype, w.rows, w.cols);
    case WeightLayout::kQuantPanels:
      return QuantPanelBytes(w.quant, w.rows, w.cols);
    case WeightLayout::kOnednn:
      return OnednnBytes(w.dtype, w.rows, w.cols).value_or(0);
    case WeightLayout::kInt8Tiles:
      return Int8TilesBytes(w.rows, w.cols);
  }
  return 0;
}

void ReadRow(const WeightMatrix& w, int64_t row, float* out) {
  const char* base = static_cast<const char*>(w.data);
  if (w.layout == WeightLayout::kQuantPanels || w.layout == WeightLayout::kInt8Tiles) {
    const int64_t group_size = w.quant.group_size > 0 ? w.quant.group_size : w.cols;
    std::vector<uint8_t> codes(w.cols), zeros(w.cols / group_size);
    std::vector<float> scales(w.cols / group_size);
    if (w.layout == WeightLayout::kInt8Tiles) {
      ReadInt8TilesRow(w, row, codes.data(), scales.data(), zeros.data());
    } else {
      ReadQuantRow(w, row, codes.data(), scales.data(), zeros.data());
    }
    for (int64_t k = 0; k < w.cols; ++k) {
      const int64_t g = k / group_size;
      out[w.input_order ? w.input_order[k] : k] =
          static_cast<float>(codes[k] - zeros[g]) * scales[g];
    }
    return;
  }
  if (w.layout == WeightLayout::kOnednn) {
    internal::ReadOnednnRow(w, row, out);
    return;
  }
  if (w.layout == WeightLayout::kRowMajor) {
    ToFloat(w.dtype, base + row * w.cols * static_cast<int64_t>(DTypeSize(w.dtype)), out, w.cols);
    return;
  }
  const int64_t first =
      (row / kPanelRows) * w.cols * kPanelRows + PanelPosition(w.dtype, row % kPanelRows);
  for (int64_t k = 0; k < w.cols; ++k) {
    const int64_t i = first + k * kPanelRows;
    switch (w.dtype) {
      case DType::kF32:
        out[k] = Load1<DType::kF32>(base, i);
        break;
      case DType::kF16:
        out[k] = Load1<DType::kF16>(base, i);
        break;
      case DType::kBF16:
        out[k] = Load1<DType::kBF16>(base, i);
        break;
      case DType::kI8:  // KV only
        out[k] = 0;
        break;
    }
  }
}

}  // namespace tandem::kernels
