#pragma once

#include <cstddef>
#include <cstdint>

#include "common/util/dtype.h"

namespace tandem::kv {

// Geometry of one paged KV block. A block holds `block_size` consecutive token positions of one
// sequence for every layer; within a block, per layer, all K heads come first, then all V heads,
// each head as [block_size][head_dim] elements of `dtype`:
//   block = layer[0] { K[kv_heads][block_size][head_dim], V[kv_heads][block_size][head_dim] },
//           layer[1] ..., layer[num_layers-1]
// An int8 head tile is followed by its rows' scales, [block_size] fp16: row r holds
// round(x / scale_r) with scale_r = max |x| / 127 of that token's head (see kv_rows.h).
// This is the unit of export/import between prefill and decode workers.
struct KvLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kBF16;

  size_t ElementBytes() const { return DTypeSize(dtype); }
  // Bytes of one token's row of one head, and of its scale (int8 only).
  size_t RowBytes() const { return static_cast<size_t>(head_dim) * ElementBytes(); }
  size_t ScaleBytes() const { return dtype == DType::kI8 ? 2 : 0; }
  // Bytes of one head's [block_size][head_dim] tile, scales included.
  size_t HeadBytes() const { return static_cast<size_t>(block_size) * (RowBytes() + ScaleBytes()); }
  // Offset of a head tile's scales from the tile's start.
  size_t ScalesOffset() const { return static_cast<size_t>(block_size) * RowBytes(); }
  // Bytes of K and V for one layer.
  size_t LayerBytes() const { return 2 * static_cast<size_t>(num_kv_heads) * HeadBytes(); }
  size_t BlockBytes() const { return static_cast<size_t>(num_layers) * LayerBytes(); }
  // Byte offset of K (resp. V) of `head` in `layer`, from the start of a block.
  size_t KOffset(int layer, int head) const { return layer * LayerBytes() + head * HeadBytes(); }
  size_t VOffset(int layer, int head) const {
    return layer * LayerBytes() + (num_kv_heads + head) * HeadBytes();
  }
  // KV bytes one token occupies across all layers: 2 x layers x kv_heads x (head_dim x elem,
  // plus a 2-byte scale for int8).
  size_t BytesPerToken() const {
    return 2 * static_cast<size_t>(num_layers) * num_kv_heads * (RowBytes() + ScaleBytes());
  }

  bool operator==(const KvLayout&) const = default;
};

}  // namespace tandem::kv
