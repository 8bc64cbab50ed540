#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "common/util/dtype.h"

namespace tandem::kv {

// No block: a free slot, or a block-table entry whose block a window evicted.
inline constexpr int32_t kNoBlock = -1;

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

// Where a pool's blocks live. A uniform pool holds blocks of `layout` only: block b starts at
// base + b * layout.BlockBytes(). A mixed-precision pool (kv_cache.dtype mixed) holds `num_wide`
// blocks of `layout` (fp16), then blocks of `narrow` (the same geometry in int8); a block's id
// says which it is, so a block table can mix them freely.
struct KvArena {
  uint8_t* base = nullptr;
  KvLayout layout;
  int64_t num_wide = std::numeric_limits<int64_t>::max();
  KvLayout narrow{};

  bool IsNarrow(int64_t id) const { return id >= num_wide; }
  const KvLayout& LayoutOf(int64_t id) const { return IsNarrow(id) ? narrow : layout; }
  uint8_t* Block(int64_t id) const {
    if (!IsNarrow(id)) return base + static_cast<size_t>(id) * layout.BlockBytes();
    return base + static_cast<size_t>(num_wide) * layout.BlockBytes() +
           static_cast<size_t>(id - num_wide) * narrow.BlockBytes();
  }
};

}  // namespace tandem::kv
