#pragma once

// The types every backend's kernels share: weight matrices as the model stores them, the
// products of one GEMM call, and one sequence's share of a paged-attention batch. Pointers to
// activations and weights are in the memory of the backend that runs the kernel; block tables
// are host memory (a device backend uploads them).

#include <cstdint>

#include "common/util/dtype.h"

namespace tandem::kernels {

// How a WeightMatrix's elements lie in memory.
enum class WeightLayout {
  kRowMajor,  // [rows, cols], as safetensors stores it: used in place when memory-mapped
  kPanels,    // packed at load for the CPU GEMM (kernels/cpu/gemm.h, PackPanels)
  // Integer codes with per-group scales in the CPU GEMM's panel order (kernels/cpu/quant_pack.h).
  kQuantPanels,
  // Prepacked at load in oneDNN's blocked layout, slice by slice (kernels/cpu/onednn_gemm.h).
  kOnednn,
  // 8-bit codes, one scale per row, for AMX-INT8 tiles and int8 x (kernels/cpu/int8_tiles.h).
  kInt8Tiles,
};

// How a kQuantPanels matrix's integers stand for weights: w[n, k] = (code - zero) * scale, with
// one scale and one zero per row n and group of `group_size` consecutive input columns k.
struct QuantFormat {
  int bits = 0;        // 8 or 4; 0: not quantized
  int group_size = 0;  // input columns per scale; equals cols for one scale per row (per-channel)
  // Zeros stored per row and group (asymmetric); otherwise every zero is 2^(bits-1).
  bool has_zero = false;
  // x is rounded to int8 before the product, dynamically: x' = round(x / s) * s with
  // s = max|x| / 127 over each `activation_block` columns of a row (0: the whole row, per token,
  // as a W8A8 checkpoint defines it). The product then runs on integers (see gemm_integer.cc),
  // on AVX512-VNNI, AVX-VNNI or AVX2, whichever the CPU has first.
  bool int8_activations = false;
  int activation_block = 0;

  bool operator==(const QuantFormat&) const = default;
};

// A weight matrix [rows, cols] in its stored dtype, in the Hugging Face nn.Linear orientation:
// rows = output features, cols = input features.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  WeightLayout layout = WeightLayout::kRowMajor;
  QuantFormat quant{};  // kQuantPanels and kInt8Tiles only; dtype is then the dtype the matrix was quantized from
  // kQuantPanels only: column j of the panels holds input column input_order[j] (an act-order
  // checkpoint's columns sorted by group, so that every group is consecutive); null: column j.
  const int32_t* input_order = nullptr;
  // kOnednn only: its plan and per-slice oneDNN memory (kernels/cpu/onednn_gemm.cc).
  const void* onednn = nullptr;
};

// One product of a GEMM call over a shared x: y = x * w^T + bias.
struct GemmOutput {
  WeightMatrix w;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
};

// One sequence's share of a batch for paged attention.
struct AttentionSequence {
  const float* q = nullptr;  // [num_tokens, num_heads, head_dim] queries of the new tokens
  float* out = nullptr;      // [num_tokens, num_heads, head_dim]
  int num_tokens = 0;        // new tokens, at positions start_pos .. start_pos+num_tokens-1
  int64_t start_pos = 0;     // position of the first new token in the sequence
  // Block ids covering positions 0..start_pos+num_tokens-1; kv::kNoBlock marks a block a window
  // evicted, whose positions are not attended to.
  const int32_t* block_table = nullptr;
};

}  // namespace tandem::kernels
