#pragma once

#include <cstdint>
#include <span>

#include "common/util/dtype.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// A row-major weight matrix [rows, cols] in its stored dtype (usually memory-mapped), in the
// Hugging Face nn.Linear layout: rows = output features, cols = input features.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// y[m, n] = sum_k x[m, k] * w[n, k] + (bias ? bias[n] : 0), for m in [0, M), n in [0, w.rows).
// x is f32 [M, w.cols] with row stride `x_stride` floats; y is f32 [M, w.rows] with row stride
// `y_stride` floats. For small M (decode) each weight row is read from memory once for all M
// rows of x; for large M the kernel tiles so weight conversion is amortized. Threads split N.
void Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w, const float* bias,
          float* y, int64_t y_stride, ThreadPool& pool);

// One product of GemmMulti: y = x * w^T + bias.
struct GemmOutput {
  WeightMatrix w;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
};

// Several products of the same x (q/k/v, gate/up) in one parallel region: for small M the
// rows of all weights are streamed as one range, so threads meet at one barrier, not several.
// Every w must have x's column count.
void GemmMulti(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
               ThreadPool& pool);

}  // namespace tandem::kernels
