#include "common/kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/attention.h"
#include "common/kernels/cpu/elementwise.h"
#include "common/kernels/cpu/gemm.h"

namespace tandem::kernels {
namespace {

// The element-wise passes go parallel in parts of at least this many floats, so that handing a
// part to the pool (a few µs) stays small beside it; a decode step's few rows stay on the calling
// thread. Each element's result does not depend on the split.
constexpr int64_t kElementwiseGrain = 32768;

int64_t RowGrain(int64_t row_floats) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, row_floats));
}

}  // namespace

std::string CpuBackend::Describe() const {
  return absl::StrCat("cpu (", pool_.num_threads(), " threads)");
}

absl::StatusOr<void*> CpuBackend::Allocate(size_t bytes) {
  void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return p;
}

void CpuBackend::Free(void* p) { std::free(p); }

void CpuBackend::Zero(void* p, size_t bytes) { std::memset(p, 0, bytes); }

void CpuBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}

void CpuBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}

void CpuBackend::Embed(const WeightMatrix& table, const int32_t* host_tokens, int64_t n,
                       float* out) {
  for (int64_t i = 0; i < n; ++i) ReadRow(table, host_tokens[i], out + i * table.cols);
}

void CpuBackend::RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
                         float* y) {
  pool_.ParallelFor(rows, RowGrain(dim), [&](int64_t r0, int64_t r1) {
    kernels::RmsNorm(x + r0 * dim, weight, eps, r1 - r0, dim, y + r0 * dim);
  });
}

void CpuBackend::GemmMulti(const float* x, int64_t m, int64_t x_stride,
                           std::span<const GemmOutput> outputs) {
  kernels::GemmMulti(x, m, x_stride, outputs, pool_);
}

void CpuBackend::Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
                      const float* bias, float* y, int64_t y_stride) {
  kernels::Gemm(x, m, x_stride, w, bias, y, y_stride, pool_);
}

void CpuBackend::SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out) {
  pool_.ParallelFor(rows, RowGrain(2 * dim), [&](int64_t r0, int64_t r1) {
    kernels::SiluMul(gate_up + r0 * 2 * dim, r1 - r0, dim, out + r0 * dim);
  });
}

void CpuBackend::Add(float* y, const float* x, int64_t n) {
  // In runs of 16 floats, so that every part but the last is whole vectors.
  constexpr int64_t kRun = 16;
  pool_.ParallelFor((n + kRun - 1) / kRun, kElementwiseGrain / kRun, [&](int64_t b, int64_t e) {
    const int64_t begin = b * kRun, end = std::min(n, e * kRun);
    AddInPlace(y + begin, x + begin, end - begin);
  });
}

void CpuBackend::Scale(float* x, float factor, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void CpuBackend::Rope(float* q, int q_heads, float* k, int k_heads, int head_dim, int64_t rows,
                      const int64_t* host_positions, const float* inv_freq) {
  const int64_t q_width = int64_t{q_heads} * head_dim, k_width = int64_t{k_heads} * head_dim;
  // One parallel pass for both, as this runs for every layer of every step.
  pool_.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (q != nullptr) ApplyRope(q + r * q_width, q_heads, head_dim, host_positions[r], inv_freq);
      if (k != nullptr) ApplyRope(k + r * k_width, k_heads, head_dim, host_positions[r], inv_freq);
    }
  });
}

void CpuBackend::GatherRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                            float* dst) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + host_rows[i] * width, width, dst + i * width);
}

void CpuBackend::ScatterRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                             float* dst) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + i * width, width, dst + host_rows[i] * width);
}

void CpuBackend::WriteKv(const float* k, const float* v, std::span<const KvWrite> writes,
                         const kv::KvArena& kv, int layer) {
  const int64_t width = int64_t{kv.layout.num_kv_heads} * kv.layout.head_dim;
  for (const KvWrite& w : writes) {
    kernels::WriteKv(k + w.row * width, v + w.row * width, w.num_tokens, w.start_pos, w.block_table,
                     kv, layer);
  }
}

void CpuBackend::PagedAttention(std::span<const AttentionSequence> seqs, int num_heads,
                                const kv::KvArena& kv, int layer, float scale) {
  kernels::PagedAttention(seqs.data(), static_cast<int>(seqs.size()), num_heads, kv, layer, scale,
                          pool_, bf16_attention_ ? AttentionMath::kBf16Tiles : AttentionMath::kF32);
}

}  // namespace tandem::kernels
