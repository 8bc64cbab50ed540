#pragma once

// Reading and writing one token's K or V row of one head inside a KV block, in any KV dtype.
// Float dtypes convert element by element; int8 rows quantize symmetrically with their own
// fp16 scale (max |x| / 127), stored after the head tile (see KvLayout).

#include <cstdint>

#include "common/kv/kv_layout.h"

namespace tandem::kv {

// Where a row lives: `block` is the start of its block, `slot` its position within the block.
struct KvRowRef {
  int layer = 0;
  int head = 0;
  bool value = false;  // V if true, else K
  int slot = 0;
};

// out[0, head_dim) = the row as f32 (dequantized for int8).
void ReadKvRow(const uint8_t* block, const KvLayout& layout, const KvRowRef& row, float* out);

// Stores in[0, head_dim) into the row (quantized for int8).
void WriteKvRow(uint8_t* block, const KvLayout& layout, const KvRowRef& row, const float* in);

// Copies a whole block from one layout to another of the same geometry (a plain copy if the
// layouts are equal; else every row is converted, quantized or dequantized).
void ConvertBlock(const uint8_t* src, const KvLayout& from, uint8_t* dst, const KvLayout& to);

// Byte offset of the row's elements from the start of its block.
inline size_t KvRowOffset(const KvLayout& layout, const KvRowRef& row) {
  const size_t head =
      row.value ? layout.VOffset(row.layer, row.head) : layout.KOffset(row.layer, row.head);
  return head + static_cast<size_t>(row.slot) * layout.RowBytes();
}

// Byte offset of an int8 row's fp16 scale from the start of its block.
inline size_t KvScaleOffset(const KvLayout& layout, const KvRowRef& row) {
  const size_t head =
      row.value ? layout.VOffset(row.layer, row.head) : layout.KOffset(row.layer, row.head);
  return head + layout.ScalesOffset() + static_cast<size_t>(row.slot) * layout.ScaleBytes();
}

}  // namespace tandem::kv
