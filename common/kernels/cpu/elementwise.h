#pragma once

#include <cstdint>

namespace tandem::kernels {

// The vector width of the functions below. AVX-512 runs the same operations per element as AVX2
// (the sum of squares in RmsNorm keeps AVX2's lanes and order), so both give the same bits and a
// worker's results do not depend on which of the two its CPU has.
enum class VectorIsa { kAvx2, kAvx512 };

// AVX-512 (F, VL, DQ) where the CPU has it, else AVX2.
VectorIsa BestVectorIsa();

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:], for `rows` rows of `dim`.
// x and y may alias. Computed in f32 like Hugging Face's LlamaRMSNorm.
void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim, float* y,
             VectorIsa isa = BestVectorIsa());

// out[i] = silu(gate[i]) * up[i] for each of `rows` rows of `dim`; gate_up holds each row as
// [gate(dim) | up(dim)] (row stride 2*dim); out is [rows, dim]. out may not alias gate_up.
void SiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out,
             VectorIsa isa = BestVectorIsa());

// y[i] += x[i].
void AddInPlace(float* y, const float* x, int64_t n, VectorIsa isa = BestVectorIsa());

// Rotary embedding in the Hugging Face "rotate_half" convention: for each head of `x`
// ([num_heads, head_dim] for one token), pairs (j, j + head_dim/2) are rotated by
// angle pos * inv_freq[j], j < head_dim/2. `inv_freq` has head_dim/2 entries.
void ApplyRope(float* x, int num_heads, int head_dim, int64_t pos, const float* inv_freq,
               VectorIsa isa = BestVectorIsa());

}  // namespace tandem::kernels
