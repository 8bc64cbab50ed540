#pragma once

// Quantized weights in the CPU GEMM's panel order (WeightLayout::kQuantPanels).
//
// A [rows, cols] matrix of integer codes stands for w[n, k] = (code[n, k] - zero[n, g]) *
// scale[n, g], g = k / group_size. As with kPanels, rows are taken 16 at a time (the last panel
// padded with zero-scale rows) and each panel is one contiguous stream:
//   codes   cols columns of 16 rows. 8 bits: byte k * 16 + r (code ^ 0x80 when the format is
//           symmetric, so the byte is the signed code - 128). 4 bits: units of 8 columns, 64
//           bytes each, row r's 8 codes in the 32-bit word at byte k / 8 * 64 + 4 r, column
//           k % 8 at bits 4 (k % 8) (one 64-byte load gives 8 columns of all 16 rows, a lane
//           per row; the last unit padded). 4-bit groups are multiples of 8 columns.
//   scales  f32 [groups][16]
//   zeros   u8 [groups][16], has_zero only (a symmetric format's zero is 2^(bits - 1))
// padded to 64 bytes. The GEMM converts codes to the exact integers code - zero, sums their
// products with x one group at a time, and scales each group's sum once: every result is the
// same at every M, as with float panels.

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/kernels/kernel_types.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// Where the parts of one panel lie, in bytes from its start.
struct QuantPanelLayout {
  int64_t groups = 0;        // scale groups per row
  int64_t scale_offset = 0;  // = bytes of codes
  int64_t zero_offset = 0;
  int64_t panel_bytes = 0;  // distance between panels

  static QuantPanelLayout Of(const QuantFormat& format, int64_t cols);
};

// OK when the GEMM can run `format` over `cols` input columns: 4 or 8 bits, and a group size
// that divides cols and either equals it or divides 256. The error names the value.
absl::Status CheckQuantFormat(const QuantFormat& format, int64_t cols);

int64_t QuantPanelBytes(const QuantFormat& format, int64_t rows, int64_t cols);

// Writes one row of a quantized matrix: codes[cols] in [0, 2^bits), scales[groups] and, for a
// format with zeros, zeros[groups] in [0, 2^bits). Called from several threads at once.
using QuantRowSource =
    std::function<void(int64_t row, uint8_t* codes, float* scales, uint8_t* zeros)>;

// Packs the rows `source` writes into `out` (QuantPanelBytes bytes, 64-byte aligned and
// zeroed) and returns the matrix. `dtype` is the float dtype the weights stand in for. Panels
// are split over `pool`.
WeightMatrix PackQuantPanels(const QuantFormat& format, DType dtype, int64_t rows, int64_t cols,
                             const QuantRowSource& source, void* out, ThreadPool& pool);

// Round-to-nearest quantization of one row as GPTQ defines it, with the scales rounded to f16
// as GPTQ checkpoints store them: symmetric, scale = 2 max|w| / (2^bits - 1) and zero
// 2^(bits - 1); with zeros, scale = (max(w, 0) - min(w, 0)) / (2^bits - 1) and zero =
// round(-min / scale). code = clamp(round(w / scale) + zero, 0, 2^bits - 1), ties to even.
void QuantizeRow(const QuantFormat& format, const float* w, int64_t cols, uint8_t* codes,
                 float* scales, uint8_t* zeros);

// The rows of float `w` (any layout) quantized by QuantizeRow into `format`, as a source for
// the packers.
QuantRowSource QuantizedRows(const WeightMatrix& w, const QuantFormat& format);

// Quantizes row-major float `w` (QuantizeRow) straight into panels at `out`.
WeightMatrix QuantizeToPanels(const WeightMatrix& w, const QuantFormat& format, void* out,
                              ThreadPool& pool);

// Row `row` of a kQuantPanels matrix as QuantRowSource writes it (zeros: every group's zero,
// 2^(bits - 1) when the format has none).
void ReadQuantRow(const WeightMatrix& w, int64_t row, uint8_t* codes, float* scales,
                  uint8_t* zeros);

}  // namespace tandem::kernels
