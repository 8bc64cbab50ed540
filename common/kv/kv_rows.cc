#include "common/kv/kv_rows.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/util/dtype.h"

namespace tandem::kv {

void ReadKvRow(const uint8_t* block, const KvLayout& layout, const KvRowRef& row, float* out) {
  const uint8_t* src = block + KvRowOffset(layout, row);
  if (layout.dtype != DType::kI8) {
    ToFloat(layout.dtype, src, out, layout.head_dim);
    return;
  }
  uint16_t bits;
  std::memcpy(&bits, block + KvScaleOffset(layout, row), sizeof(bits));
  const float scale = F16ToF32(bits);
  const auto* q = reinterpret_cast<const int8_t*>(src);
  for (int i = 0; i < layout.head_dim; ++i) out[i] = q[i] * scale;
}

void WriteKvRow(uint8_t* block, const KvLayout& layout, const KvRowRef& row, const float* in) {
  uint8_t* dst = block + KvRowOffset(layout, row);
  if (layout.dtype != DType::kI8) {
    FromFloat(layout.dtype, in, dst, layout.head_dim);
    return;
  }
  float max_abs = 0;
  for (int i = 0; i < layout.head_dim; ++i) max_abs = std::fmax(max_abs, std::fabs(in[i]));
  // The scale is rounded to fp16 first and the values divided by the rounded scale, so reading
  // back multiplies by exactly the scale they were quantized with.
  const uint16_t bits = F32ToF16(max_abs / 127.0f);
  const float scale = F16ToF32(bits);
  const float inv = scale > 0 && std::isfinite(scale) ? 1.0f / scale : 0.0f;
  auto* q = reinterpret_cast<int8_t*>(dst);
  for (int i = 0; i < layout.head_dim; ++i) q[i] = RoundToI8(in[i] * inv);
  std::memcpy(block + KvScaleOffset(layout, row), &bits, sizeof(bits));
}

void ConvertBlock(const uint8_t* src, const KvLayout& from, uint8_t* dst, const KvLayout& to) {
  if (from == to) {
    std::memcpy(dst, src, from.BlockBytes());
    return;
  }
  std::vector<float> row(from.head_dim);
  for (int layer = 0; layer < from.num_layers; ++layer) {
    for (int head = 0; head < from.num_kv_heads; ++head) {
      for (bool value : {false, true}) {
        for (int slot = 0; slot < from.block_size; ++slot) {
          const KvRowRef ref{layer, head, value, slot};
          ReadKvRow(src, from, ref, row.data());
          WriteKvRow(dst, to, ref, row.data());
        }
      }
    }
  }
}

}  // namespace tandem::kv
