#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/kernels/kernel_types.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// Rows per panel of WeightLayout::kPanels.
inline constexpr int64_t kPanelRows = 16;

// The panel layout: ceil(rows / 16) panels of 16 rows, one after another, each stored column by
// column ([cols][16]; rows past the last are zero). Every product then reads a panel as one
// contiguous stream, in the order the GEMM microkernel consumes it, and nothing is repacked
// per call. In bf16 the 16 values of a column are interleaved (row r at position 2r for r < 8,
// at 2(r - 8) + 1 otherwise), so one shift and one mask turn them into two f32 vectors.
// Gemm over panels uses the same reduction order for every M: a row's result does not depend
// on how many other rows share the call.
int64_t PanelBytes(DType dtype, int64_t rows, int64_t cols);

// Packs row-major `w` into `out` (PanelBytes bytes, 32-byte aligned) and returns the view of
// it. Columns are split over `pool`.
WeightMatrix PackPanels(const WeightMatrix& w, void* out, ThreadPool& pool);

// Bytes `w` takes in memory in its layout.
int64_t MatrixBytes(const WeightMatrix& w);

// Row `row` of `w`, in any layout, as f32 into out[0, w.cols) (quantized: dequantized).
void ReadRow(const WeightMatrix& w, int64_t row, float* out);

// Which kernels multiply quantized `w` on this CPU now, for people: "integer (AVX512-VNNI
// vpdpbusd)" for int8 activations on the integer kernels, else "float (codes to f32 in
// registers, AVX-512)" and the like. Empty for a matrix that is not quantized.
std::string QuantKernelName(const WeightMatrix& w);

// y[m, n] = sum_k x[m, k] * w[n, k] + (bias ? bias[n] : 0), for m in [0, M), n in [0, w.rows).
// x is f32 [M, w.cols] with row stride `x_stride` floats; y is f32 [M, w.rows] with row stride
// `y_stride` floats. Each weight is read from memory once for all M rows of x. Row-major
// weights are streamed row by row for small M (decode) and packed block by block for large M;
// panel weights (kPanels) take the blocked kernel at every M, unpacked. Threads split N.
void Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w, const float* bias,
          float* y, int64_t y_stride, ThreadPool& pool);

// Several products of the same x (q/k/v, gate/up) in one parallel region: for small M the
// rows of all weights are streamed as one range, so threads meet at one barrier, not several.
// Every w must have x's column count.
void GemmMulti(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
               ThreadPool& pool);

}  // namespace tandem::kernels
