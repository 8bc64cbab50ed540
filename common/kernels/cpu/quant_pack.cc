#include "common/kernels/cpu/quant_pack.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/gemm.h"

namespace tandem::kernels {
namespace {

constexpr int64_t kRows = kPanelRows;
// The K block of the tiled GEMM: a group either divides it or spans whole rows.
constexpr int64_t kGroupBlock = 256;
// 4-bit codes: a unit of 8 columns is 16 rows of 32 bits, each row's 8 nibbles.
constexpr int64_t kUnit = 8;
constexpr int64_t kUnitBytes = kUnit * kRows / 2;

// Byte and shift of 4-bit column k of panel row r.
int64_t NibbleByte(int64_t k, int64_t r) { return k / kUnit * kUnitBytes + r * 4 + k % kUnit / 2; }
int NibbleShift(int64_t k) { return static_cast<int>(k % 2 * 4); }

int64_t GroupSize(const QuantFormat& f, int64_t cols) {
  return f.group_size > 0 ? f.group_size : cols;
}

}  // namespace

QuantPanelLayout QuantPanelLayout::Of(const QuantFormat& f, int64_t cols) {
  QuantPanelLayout l;
  const int64_t g = GroupSize(f, cols);
  l.groups = g > 0 ? cols / g : 0;
  // 4-bit codes come in units of 8 columns, the last one padded.
  l.scale_offset = f.bits == 8 ? cols * kRows : (cols + kUnit - 1) / kUnit * kUnitBytes;
  l.zero_offset = l.scale_offset + l.groups * kRows * static_cast<int64_t>(sizeof(float));
  const int64_t end = l.zero_offset + (f.has_zero ? l.groups * kRows : 0);
  l.panel_bytes = (end + 63) / 64 * 64;
  return l;
}

absl::Status CheckQuantFormat(const QuantFormat& f, int64_t cols) {
  if (f.bits != 4 && f.bits != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized weights must have 4 or 8 bits, got ", f.bits));
  }
  const int64_t g = GroupSize(f, cols);
  if (cols <= 0 || g <= 0 || cols % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat("group size ", f.group_size,
                                                   " does not divide the input dimension ", cols));
  }
  if (g != cols && (kGroupBlock % g != 0 || (f.bits == 4 && g % kUnit != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size ", f.group_size, " is not supported: Tandem runs groups that divide 256 (",
        f.bits == 4 ? "8, " : "", "16, 32, 64, 128, 256) or one group per row (-1)"));
  }
  return absl::OkStatus();
}

int64_t QuantPanelBytes(const QuantFormat& f, int64_t rows, int64_t cols) {
  return (rows + kRows - 1) / kRows * QuantPanelLayout::Of(f, cols).panel_bytes;
}

WeightMatrix PackQuantPanels(const QuantFormat& f, DType dtype, int64_t rows, int64_t cols,
                             const QuantRowSource& source, void* out, ThreadPool& pool) {
  const QuantPanelLayout l = QuantPanelLayout::Of(f, cols);
  const uint8_t sign = f.bits == 8 && !f.has_zero ? 0x80 : 0;
  pool.ParallelFor((rows + kRows - 1) / kRows, 1, [&](int64_t p0, int64_t p1) {
    std::vector<uint8_t> codes(cols), zeros(l.groups);
    std::vector<float> scales(l.groups);
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* panel = static_cast<uint8_t*>(out) + p * l.panel_bytes;
      auto* panel_scales = reinterpret_cast<float*>(panel + l.scale_offset);
      for (int r = 0; r < kRows && p * kRows + r < rows; ++r) {
        source(p * kRows + r, codes.data(), scales.data(), zeros.data());
        if (f.bits == 8) {
          for (int64_t k = 0; k < cols; ++k) panel[k * kRows + r] = codes[k] ^ sign;
        } else {
          for (int64_t k = 0; k < cols; ++k) {
            panel[NibbleByte(k, r)] |= static_cast<uint8_t>((codes[k] & 0xF) << NibbleShift(k));
          }
        }
        for (int64_t g = 0; g < l.groups; ++g) {
          panel_scales[g * kRows + r] = scales[g];
          if (f.has_zero) panel[l.zero_offset + g * kRows + r] = zeros[g];
        }
      }
    }
  });
  return WeightMatrix{.data = out,
                      .dtype = dtype,
                      .rows = rows,
                      .cols = cols,
                      .layout = WeightLayout::kQuantPanels,
                      .quant = f};
}

void QuantizeRow(const QuantFormat& f, const float* w, int64_t cols, uint8_t* codes,
                 float* scales, uint8_t* zeros) {
  const int64_t g = GroupSize(f, cols);
  const float max_code = static_cast<float>((1 << f.bits) - 1);
  for (int64_t k0 = 0; k0 < cols; k0 += g) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t k = k0; k < k0 + g; ++k) {
      lo = std::min(lo, w[k]);
      hi = std::max(hi, w[k]);
    }
    if (!f.has_zero) {
      hi = std::max(-lo, hi);
      lo = -hi;
    }
    if (lo == 0.0f && hi == 0.0f) {
      lo = -1.0f;
      hi = 1.0f;
    }
    const float scale = F16ToF32(F32ToF16((hi - lo) / max_code));
    float zero = static_cast<float>(1 << (f.bits - 1));
    if (f.has_zero) {
      zero = scale > 0.0f ? std::clamp(std::nearbyint(-lo / scale), 0.0f, max_code) : 0.0f;
    }
    for (int64_t k = k0; k < k0 + g; ++k) {
      const float q = scale > 0.0f ? std::nearbyint(w[k] / scale) + zero : zero;
      codes[k] = static_cast<uint8_t>(std::clamp(q, 0.0f, max_code));
    }
    scales[k0 / g] = scale;
    if (f.has_zero) zeros[k0 / g] = static_cast<uint8_t>(zero);
  }
}

QuantRowSource QuantizedRows(const WeightMatrix& w, const QuantFormat& f) {
  return [w, f](int64_t row, uint8_t* codes, float* scales, uint8_t* zeros) {
    thread_local std::vector<float> values;
    values.resize(w.cols);
    ReadRow(w, row, values.data());
    QuantizeRow(f, values.data(), w.cols, codes, scales, zeros);
  };
}

WeightMatrix QuantizeToPanels(const WeightMatrix& w, const QuantFormat& f, void* out,
                              ThreadPool& pool) {
  return PackQuantPanels(f, w.dtype, w.rows, w.cols, QuantizedRows(w, f), out, pool);
}

void ReadQuantRow(const WeightMatrix& w, int64_t row, uint8_t* codes, float* scales,
                  uint8_t* zeros) {
  const QuantFormat& f = w.quant;
  const QuantPanelLayout l = QuantPanelLayout::Of(f, w.cols);
  const uint8_t* panel = static_cast<const uint8_t*>(w.data) + row / kRows * l.panel_bytes;
  const int64_t r = row % kRows;
  const uint8_t sign = f.bits == 8 && !f.has_zero ? 0x80 : 0;
  for (int64_t k = 0; k < w.cols; ++k) {
    codes[k] = f.bits == 8 ? panel[k * kRows + r] ^ sign
                           : (panel[NibbleByte(k, r)] >> NibbleShift(k)) & 0xF;
  }
  const auto* panel_scales = reinterpret_cast<const float*>(panel + l.scale_offset);
  for (int64_t g = 0; g < l.groups; ++g) {
    scales[g] = panel_scales[g * kRows + r];
    zeros[g] = f.has_zero ? panel[l.zero_offset + g * kRows + r]
                          : static_cast<uint8_t>(1 << (f.bits - 1));
  }
}

}  // namespace tandem::kernels
