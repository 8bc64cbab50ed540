#pragma once

// The compute seam under the forward pass. A Backend owns the memory its kernels read and write
// (host memory for the CPU, device memory for CUDA) and runs the forward pass's operations on
// it. The model holds backend pointers only and never asks which backend it has; one is chosen
// at load from `model.device` (backend_factory.h).
//
// Pointer arguments are backend memory unless their name starts with host_, or they are the
// block tables inside AttentionSequence / KvWrite: metadata of the step, which a device backend
// uploads. Operations are ordered: each sees the results of the ones issued before it; a call
// that returns data to the host (CopyToHost) waits for everything issued before it.
// Not thread-safe: one engine loop drives a backend, as it drives the model.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/kernels/kernel_types.h"
#include "common/kv/kv_layout.h"

namespace tandem::kernels {

// The new tokens of one sequence whose K and V a WriteKv call stores.
struct KvWrite {
  int64_t row = 0;  // first row of the sequence's tokens in the k and v arguments
  int num_tokens = 0;
  int64_t start_pos = 0;  // position of the first token in the sequence
  const int32_t* block_table = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu (N threads)", "cuda:0 (NVIDIA H200, 139 GiB)": for logs and the startup line.
  virtual std::string Describe() const = 0;
  // True when backend memory is ordinary host memory, so results can be read in place.
  virtual bool host_addressable() const = 0;

  // ---- Memory ----
  // `bytes` of backend memory, 64-byte aligned, uninitialized. ResourceExhausted with the
  // numbers (asked, free, total) when it cannot be had.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual void Zero(void* p, size_t bytes) = 0;
  // Backend memory that holds `host`'s bytes for the backend's lifetime (weights, norms): the
  // host pointer itself where memory is shared, else a copy owned by the backend.
  virtual absl::StatusOr<const void*> Resident(const void* host, size_t bytes) = 0;
  // Bytes Resident has copied into backend memory (0 where it is the host's).
  virtual size_t resident_bytes() const { return 0; }
  // A weight matrix the backend's GEMM can read; InvalidArgument for a layout it cannot use.
  virtual absl::StatusOr<WeightMatrix> ResidentWeight(const WeightMatrix& host) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits for the operations issued so far and returns the first failure among them (a device
  // fault, an allocation that failed mid-step), clearing it.
  virtual absl::Status Finish() { return absl::OkStatus(); }

  // ---- Forward-pass operations (f32 activations) ----
  // out[i, :] = row host_tokens[i] of `table`, as f32.
  virtual void Embed(const WeightMatrix& table, const int32_t* host_tokens, int64_t n,
                     float* out) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight; x and y may alias.
  virtual void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
                       float* y) = 0;
  // Every output's y = x * w^T + bias over the same x [m, w.cols] (row stride x_stride).
  virtual void GemmMulti(const float* x, int64_t m, int64_t x_stride,
                         std::span<const GemmOutput> outputs) = 0;
  // y = x * w^T + bias: one product of GemmMulti.
  virtual void Gemm(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
                    const float* bias, float* y, int64_t y_stride) = 0;
  // out[r, :] = silu(gate) * up, with gate_up's rows as [gate(dim) | up(dim)].
  virtual void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out) = 0;
  virtual void Add(float* y, const float* x, int64_t n) = 0;  // y += x
  virtual void Scale(float* x, float factor, int64_t n) = 0;  // x *= factor
  // Rotary embedding ("rotate_half") of `rows` rows at positions host_positions[r]: q has
  // q_heads heads per row, k has k_heads (either may be null). inv_freq: head_dim / 2 floats.
  virtual void Rope(float* q, int q_heads, float* k, int k_heads, int head_dim, int64_t rows,
                    const int64_t* host_positions, const float* inv_freq) = 0;
  // dst[i, :] = src[host_rows[i], :] (Gather) or dst[host_rows[i], :] = src[i, :] (Scatter),
  // rows of `width` floats.
  virtual void GatherRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                          float* dst) = 0;
  virtual void ScatterRows(const float* src, int64_t width, const int64_t* host_rows, int64_t n,
                           float* dst) = 0;
  // Stores K and V ([rows, kv_heads, head_dim] each) of `layer` into their cache slots,
  // converted to each block's dtype (kv/kv_rows.h).
  virtual void WriteKv(const float* k, const float* v, std::span<const KvWrite> writes,
                       const kv::KvArena& kv, int layer) = 0;
  // Causal paged attention of `layer` for each sequence (kernels/cpu/attention.h semantics).
  virtual void PagedAttention(std::span<const AttentionSequence> seqs, int num_heads,
                              const kv::KvArena& kv, int layer, float scale) = 0;
  // Whether attention may multiply in bf16 (the CPU's AMX tiles: kernels/cpu/attention.h's
  // AttentionMath::kBf16Tiles), set once at load where model.cpu_gemm chose oneDNN; backends
  // without such a form ignore it.
  virtual void SetBf16Attention(bool) {}
};

// Backend memory released with its owner; grows, never shrinks.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { Release(); }

  // Ensures room for `count` floats (contents are lost when it grows).
  absl::Status Reserve(Backend& backend, size_t count);
  float* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release();

  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem::kernels
