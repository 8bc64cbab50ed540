#pragma once

#include <string>

#include "common/kernels/backend.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// The CPU backend: the AVX2+FMA kernels of this folder on host memory, parallel over `pool`.
// Resident memory is the host's own (weights stay memory-mapped or packed where they are).
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool& pool) : pool_(pool) {}

  std::string Describe() const override;
  bool host_addressable() const override { return true; }

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* p) override;
  void Zero(void* p, size_t bytes) override;
  absl::StatusOr<const void*> Resident(const void* host, size_t bytes) override { return host; }
  absl::StatusOr<WeightMatrix> ResidentWeight(const WeightMatrix& host) override { return host; }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override;

  void Embed(const WeightMatrix& table, const int32_t* host_tokens, int64_t n, float* out) override;
  void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
               float* y) override;
  void GemmMulti(const float* x, int64_t m, int64_t x_stride,
                 std::span<const GemmOutput> outputs) override;
  void Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w, const float* bias,
            float* y, int64_t y_stride) override;
  void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out) override;
  void Add(float* y, const float* x, int64_t n) override;
  void Scale(float* x, float factor, int64_t n) override;
  void Rope(float* q, int q_heads, float* k, int k_heads, int head_dim, int64_t rows,
            const int64_t* host_positions, const float* inv_freq) override;
  void GatherRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                  float* dst) override;
  void ScatterRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                   float* dst) override;
  void WriteKv(const float* k, const float* v, std::span<const KvWrite> writes,
               const kv::KvArena& kv, int layer) override;
  void PagedAttention(std::span<const AttentionSequence> seqs, int num_heads, const kv::KvArena& kv,
                      int layer, float scale) override;
  void SetBf16Attention(bool on) override { bf16_attention_ = on; }

 private:
  ThreadPool& pool_;
  bool bf16_attention_ = false;
};

}  // namespace tandem::kernels
