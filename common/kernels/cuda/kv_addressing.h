#pragma once

// Where a token's K or V row of one head lies in a KV pool, as plain arithmetic that host and
// device code share: the CUDA kernels read and write the same blocks as the CPU (kv/kv_layout.h),
// and a host test checks these formulas against KvLayout's.

#include <cstdint>
#include <limits>

#include "common/kv/kv_layout.h"

#ifdef __CUDACC__
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem::kernels::cuda {

// One of a pool's two block geometries (wide, or int8 narrow), as the kernels see it.
struct KvGeometry {
  int64_t row_bytes = 0;    // head_dim x element size
  int64_t scale_bytes = 0;  // 2 for int8 (fp16 scale per row), else 0
  int64_t head_bytes = 0;   // block_size x (row_bytes + scale_bytes)
  int64_t layer_bytes = 0;  // 2 x kv_heads x head_bytes
  int64_t block_bytes = 0;  // layers x layer_bytes
  DType dtype = DType::kBF16;
};

// A KvArena with its device base.
struct KvPool {
  uint8_t* base = nullptr;
  int64_t num_wide = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvGeometry wide, narrow;
};

inline KvGeometry GeometryOf(const kv::KvLayout& l) {
  return {.row_bytes = static_cast<int64_t>(l.RowBytes()),
          .scale_bytes = static_cast<int64_t>(l.ScaleBytes()),
          .head_bytes = static_cast<int64_t>(l.HeadBytes()),
          .layer_bytes = static_cast<int64_t>(l.LayerBytes()),
          .block_bytes = static_cast<int64_t>(l.BlockBytes()),
          .dtype = l.dtype};
}

inline KvPool PoolOf(const kv::KvArena& a) {
  return {.base = a.base,
          .num_wide = a.num_wide,
          .block_size = a.layout.block_size,
          .num_kv_heads = a.layout.num_kv_heads,
          .head_dim = a.layout.head_dim,
          .wide = GeometryOf(a.layout),
          .narrow = a.num_wide == std::numeric_limits<int64_t>::max() ? GeometryOf(a.layout)
                                                                      : GeometryOf(a.narrow)};
}

// A row's elements and, for int8, its scale.
struct KvRowAddress {
  uint8_t* row = nullptr;
  uint8_t* scale = nullptr;  // null unless int8
  DType dtype = DType::kBF16;
};

TANDEM_HOST_DEVICE inline KvRowAddress LocateRow(const KvPool& p, int64_t block, int layer,
                                                 int head, bool value, int slot) {
  const bool narrow = block >= p.num_wide;
  const KvGeometry& g = narrow ? p.narrow : p.wide;
  uint8_t* start =
      narrow ? p.base + p.num_wide * p.wide.block_bytes + (block - p.num_wide) * g.block_bytes
             : p.base + block * g.block_bytes;
  const int64_t head_index = value ? p.num_kv_heads + head : head;
  uint8_t* tile = start + layer * g.layer_bytes + head_index * g.head_bytes;
  KvRowAddress a;
  a.row = tile + slot * g.row_bytes;
  a.scale = g.scale_bytes != 0 ? tile + p.block_size * g.row_bytes + slot * g.scale_bytes : nullptr;
  a.dtype = g.dtype;
  return a;
}

}  // namespace tandem::kernels::cuda
