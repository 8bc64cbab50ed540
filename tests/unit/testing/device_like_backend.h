#pragma once

// A backend that computes with the CPU kernels but keeps its memory to itself, as a GPU's does:
// host_addressable() is false, weights and KV pools are copies it owns, and results reach the
// host only through CopyToHost. Serving on it runs every device-memory path of the model, the
// engine and the KV cache (staged logits, block reads and writes through the host) on machines
// without a GPU, and must give exactly the CPU backend's results.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kernels/cpu/cpu_backend.h"
#include "common/model/model.h"
#include "common/util/status_macros.h"

namespace tandem::testing {

class DeviceLikeBackend final : public kernels::Backend {
 public:
  explicit DeviceLikeBackend(ThreadPool& pool) : cpu_(pool) {}
  ~DeviceLikeBackend() override {
    for (void* p : resident_) std::free(p);
  }

  std::string Describe() const override { return "device-like " + cpu_.Describe(); }
  bool host_addressable() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return cpu_.Allocate(bytes); }
  void Free(void* p) override { cpu_.Free(p); }
  void Zero(void* p, size_t bytes) override { cpu_.Zero(p, bytes); }
  absl::StatusOr<const void*> Resident(const void* host, size_t bytes) override {
    void* copy = std::malloc(bytes > 0 ? bytes : 1);
    std::memcpy(copy, host, bytes);
    resident_.push_back(copy);
    return copy;
  }
  absl::StatusOr<kernels::WeightMatrix> ResidentWeight(const kernels::WeightMatrix& w) override {
    if (w.layout != kernels::WeightLayout::kRowMajor) {
      return absl::InvalidArgumentError("device-like backend: row-major weights only");
    }
    kernels::WeightMatrix copy = w;
    TANDEM_ASSIGN_OR_RETURN(copy.data, Resident(w.data, w.rows * w.cols * DTypeSize(w.dtype)));
    return copy;
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    ++copies_to_host_;
    std::memcpy(host_dst, src, bytes);
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    ++copies_from_host_;
    std::memcpy(dst, host_src, bytes);
  }
  void Embed(const kernels::WeightMatrix& t, const int32_t* tokens, int64_t n,
             float* out) override {
    cpu_.Embed(t, tokens, n, out);
  }
  void RmsNorm(const float* x, const float* w, float eps, int64_t rows, int64_t dim,
               float* y) override {
    cpu_.RmsNorm(x, w, eps, rows, dim, y);
  }
  void GemmMulti(const float* x, int64_t m, int64_t stride,
                 std::span<const kernels::GemmOutput> outputs) override {
    cpu_.GemmMulti(x, m, stride, outputs);
  }
  void Gemm(const float* x, int64_t m, int64_t stride, const kernels::WeightMatrix& w,
            const float* bias, float* y, int64_t y_stride) override {
    cpu_.Gemm(x, m, stride, w, bias, y, y_stride);
  }
  void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out) override {
    cpu_.SiluMul(gate_up, rows, dim, out);
  }
  void Add(float* y, const float* x, int64_t n) override { cpu_.Add(y, x, n); }
  void Scale(float* x, float f, int64_t n) override { cpu_.Scale(x, f, n); }
  void Rope(float* q, int qh, float* k, int kh, int hd, int64_t rows, const int64_t* positions,
            const float* inv_freq) override {
    cpu_.Rope(q, qh, k, kh, hd, rows, positions, inv_freq);
  }
  void GatherRows(const float* src, int64_t w, const int64_t* rows, int64_t n,
                  float* dst) override {
    cpu_.GatherRows(src, w, rows, n, dst);
  }
  void ScatterRows(const float* src, int64_t w, const int64_t* rows, int64_t n,
                   float* dst) override {
    cpu_.ScatterRows(src, w, rows, n, dst);
  }
  void WriteKv(const float* k, const float* v, std::span<const kernels::KvWrite> writes,
               const kv::KvArena& kv, int layer) override {
    cpu_.WriteKv(k, v, writes, kv, layer);
  }
  void PagedAttention(std::span<const kernels::AttentionSequence> seqs, int heads,
                      const kv::KvArena& kv, int layer, float scale) override {
    cpu_.PagedAttention(seqs, heads, kv, layer, scale);
  }

  int64_t copies_to_host() const { return copies_to_host_; }
  int64_t copies_from_host() const { return copies_from_host_; }

 private:
  kernels::CpuBackend cpu_;
  std::vector<void*> resident_;
  int64_t copies_to_host_ = 0, copies_from_host_ = 0;
};

// The model in `dir` on a DeviceLikeBackend (weights memory-mapped, then copied to it).
inline absl::StatusOr<std::unique_ptr<model::Model>> LoadDeviceLikeModel(const std::string& dir,
                                                                         ThreadPool& pool) {
  TANDEM_ASSIGN_OR_RETURN(model::ModelConfig config, model::ModelConfig::FromDirectory(dir));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelWeights> weights,
                          model::ModelWeights::Load(dir, config, {.pool = &pool}));
  return model::Model::Create(std::move(config), std::move(weights),
                              std::make_unique<DeviceLikeBackend>(pool), pool);
}

}  // namespace tandem::testing
