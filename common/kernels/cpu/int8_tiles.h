#pragma once

// 8-bit weights with one scale (and zero) per output row, multiplied by x rounded to int8 with
// one scale per row (per token, as W8A8 checkpoints define it), on AMX-INT8 tiles
// (WeightLayout::kInt8Tiles). Chosen at load on a CPU with AMX unless model.cpu_gemm is tandem.
//
// A product is one exact integer per output: t = sum_k xq[m, k] * (code[n, k] - zero[n]), with
// |t| < 2^31 for fewer than 65,536 input columns. Every kernel computes that integer (AMX's
// tdpbsud for calls of many rows, AVX512-VNNI's vpdpbusd for a decode step's few) and turns it
// into a float with the same operations, y = fma(float(t) * s_x[m], s_w[n], bias[n]): a row's
// result is the same bits in any batch, at any chunking, on either kernel.
//
// Layout: the rows are padded to slices of 64, the columns to blocks of 64. Per slice, per K
// block, per 16 outputs, 16 rows of 64 bytes: row q holds, for each of the 16 outputs c, its
// codes of input columns 4q..4q+3 (unsigned, as the format stores them) at bytes 4c..4c+3. That
// is AMX's int8 B operand, one tile per 16 outputs, and vpdpbusd's operand with one lane per
// output. After the codes: f32 scales and int32 zeros, one per padded row.

#include <cstdint>
#include <span>
#include <string>

#include "common/kernels/cpu/quant_pack.h"
#include "common/kernels/kernel_types.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// Whether the tiles can multiply `format` over `cols` input columns on this CPU: 8 bits, one
// group per row, int8 activations per token (activation_block 0), fewer than 65,536 columns,
// and AMX-INT8 granted to the process.
bool Int8TilesFit(const QuantFormat& format, int64_t cols);

int64_t Int8TilesBytes(int64_t rows, int64_t cols);

// Packs the rows `source` writes into `out` (Int8TilesBytes bytes, 64-byte aligned and zeroed)
// and returns the matrix; slices are split over `pool`. `format` must fit (Int8TilesFit).
WeightMatrix PackInt8Tiles(const QuantFormat& format, DType dtype, int64_t rows, int64_t cols,
                           const QuantRowSource& source, void* out, ThreadPool& pool);

// Row `row` as QuantRowSource wrote it (one scale and one zero).
void ReadInt8TilesRow(const WeightMatrix& w, int64_t row, uint8_t* codes, float* scales,
                      uint8_t* zeros);

// The kernels, for people: "integer (AMX-INT8 tdpbsud; AVX512-VNNI vpdpbusd up to 4 rows)".
std::string Int8TilesKernelName();

namespace internal {

// Gemm/GemmMulti for kInt8Tiles weights of the same column count.
void GemmInt8Tiles(const float* x, int64_t m, int64_t x_stride, std::span<const GemmOutput> outputs,
                   ThreadPool& pool);

// Calls of up to `rows` rows run on vpdpbusd, more on the tiles (tests and benchmarks; the
// default is kInt8VnniRows). Returns the previous value.
int64_t SetInt8VnniRows(int64_t rows);
// Whether calls of more than 16 rows run two chunks of 16 a pass with x in the tile layout (the
// default), or one chunk a pass with x row-major, as before; for benchmarks. Returns the previous
// setting. The sums are the same either way.
bool PairInt8Chunks(bool pair);
inline constexpr int64_t kInt8VnniRows = 4;

}  // namespace internal
}  // namespace tandem::kernels
