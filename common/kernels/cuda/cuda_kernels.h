#pragma once

// Launchers of the CUDA kernels (kernels.cu, attention.cu), callable from host C++. Every
// pointer is device memory; every launch is asynchronous on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/kernels/cuda/kv_addressing.h"
#include "common/util/dtype.h"

namespace tandem::kernels::cuda {

// out[i, :] = table[tokens[i], :] as f32; table is [rows, cols] of `dtype` (f32, f16, bf16).
void LaunchEmbed(const void* table, DType dtype, int64_t cols, const int32_t* tokens, int64_t n,
                 float* out, cudaStream_t stream);
void LaunchRmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
                   float* y, cudaStream_t stream);
void LaunchSiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out,
                   cudaStream_t stream);
void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t stream);
void LaunchScale(float* x, float factor, int64_t n, cudaStream_t stream);
// Rotary embedding of rows at `positions` (int64); either of q and k may be null.
void LaunchRope(float* q, int q_heads, float* k, int k_heads, int head_dim, int64_t rows,
                const int64_t* positions, const float* inv_freq, cudaStream_t stream);
// dst[i] = src[rows[i]] (scatter false) or dst[rows[i]] = src[i] (scatter true).
void LaunchMoveRows(const float* src, int64_t width, const int64_t* rows, int64_t n, float* dst,
                    bool scatter, cudaStream_t stream);
// out[r, c] = x[r * x_stride + c] converted to `dtype` (f16 or bf16), out dense [rows, cols].
void LaunchConvertRows(const float* x, int64_t rows, int64_t cols, int64_t x_stride, DType dtype,
                       void* out, cudaStream_t stream);

// One sequence of a WriteKv or attention launch, uploaded with the step's metadata.
struct SequenceDesc {
  const float* q = nullptr;  // attention only
  float* out = nullptr;      // attention only
  int64_t row = 0;           // WriteKv: first row in k and v
  int64_t first_item = 0;    // tokens of the sequences before this one in the launch
  int64_t start_pos = 0;
  int num_tokens = 0;
  int table_offset = 0;  // into the launch's block tables
};

// Stores K and V rows ([rows, kv_heads, head_dim] f32) into the pool, converted to each
// block's dtype exactly as kv::WriteKvRow does.
void LaunchWriteKv(const float* k, const float* v, const SequenceDesc* seqs, int num_seqs,
                   int64_t total_tokens, const int32_t* tables, const KvPool& pool, int layer,
                   cudaStream_t stream);

// Causal paged attention over the pool (kernels/cpu/attention.h semantics): one warp per
// (token, query head), keys streamed with an online softmax, nothing of size T x T stored.
void LaunchPagedAttention(const SequenceDesc* seqs, int num_seqs, int64_t total_tokens,
                          int num_heads, const int32_t* tables, const KvPool& pool, int layer,
                          float scale, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
