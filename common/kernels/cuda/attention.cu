// KV writes and paged attention of the CUDA backend, over the same block layout as the CPU
// (kv/kv_layout.h), for f32, f16, bf16 and int8 blocks (a mixed pool included).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/kernels/cuda/cuda_kernels.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
// head_dim <= 256: each lane holds at most 8 of a row's elements.
constexpr int kMaxPerLane = 8;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sequence whose items [first_item, first_item + num_tokens) hold `item`.
__device__ int FindSequence(const SequenceDesc* seqs, int num_seqs, int64_t item) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (seqs[mid].first_item <= item) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Element d of a row, as f32 (int8 rows times their scale).
__device__ float LoadElement(const KvRowAddress& a, float scale, int d) {
  switch (a.dtype) {
    case DType::kF32:
      return reinterpret_cast<const float*>(a.row)[d];
    case DType::kF16:
      return __half2float(reinterpret_cast<const __half*>(a.row)[d]);
    case DType::kBF16:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.row)[d]);
    case DType::kI8:
      return static_cast<float>(reinterpret_cast<const int8_t*>(a.row)[d]) * scale;
  }
  return 0.0f;
}

__device__ float RowScale(const KvRowAddress& a) {
  return a.scale != nullptr ? __half2float(*reinterpret_cast<const __half*>(a.scale)) : 1.0f;
}

// One warp per (token, KV head, K or V): the lanes split the row. int8 rows are quantized as
// kv::WriteKvRow does: scale = fp16(max|x| / 127), values round(x / scale) to nearest even,
// saturated to [-127, 127], NaN to 0.
__global__ void WriteKvKernel(const float* k, const float* v, const SequenceDesc* seqs,
                              int num_seqs, int64_t total_tokens, const int32_t* tables,
                              KvPool pool, int layer) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int64_t per_token = 2LL * pool.num_kv_heads;
  if (warp >= total_tokens * per_token) return;
  const int64_t item = warp / per_token;
  const int head = static_cast<int>((warp % per_token) / 2);
  const bool value = (warp % 2) == 1;
  const SequenceDesc& s = seqs[FindSequence(seqs, num_seqs, item)];
  const int64_t t = item - s.first_item;
  const int64_t pos = s.start_pos + t;
  const int64_t block = tables[s.table_offset + pos / pool.block_size];
  const KvRowAddress a =
      LocateRow(pool, block, layer, head, value, static_cast<int>(pos % pool.block_size));
  const float* src = (value ? v : k) + ((s.row + t) * pool.num_kv_heads + head) * pool.head_dim;
  const int d_max = pool.head_dim;
  switch (a.dtype) {
    case DType::kF32:
      for (int d = lane; d < d_max; d += kWarp) reinterpret_cast<float*>(a.row)[d] = src[d];
      return;
    case DType::kF16:
      for (int d = lane; d < d_max; d += kWarp) {
        reinterpret_cast<__half*>(a.row)[d] = __float2half_rn(src[d]);
      }
      return;
    case DType::kBF16:
      for (int d = lane; d < d_max; d += kWarp) {
        reinterpret_cast<__nv_bfloat16*>(a.row)[d] = __float2bfloat16_rn(src[d]);
      }
      return;
    case DType::kI8: {
      float max_abs = 0.0f;
      for (int d = lane; d < d_max; d += kWarp) max_abs = fmaxf(max_abs, fabsf(src[d]));
      max_abs = WarpMax(max_abs);
      const __half scale_bits = __float2half_rn(max_abs / 127.0f);
      const float scale = __half2float(scale_bits);
      const float inv = scale > 0.0f && isfinite(scale) ? 1.0f / scale : 0.0f;
      for (int d = lane; d < d_max; d += kWarp) {
        const float r = nearbyintf(src[d] * inv);
        const float c = r >= 127.0f ? 127.0f : r <= -127.0f ? -127.0f : (r == r ? r : 0.0f);
        reinterpret_cast<int8_t*>(a.row)[d] = static_cast<int8_t>(c);
      }
      if (lane == 0) *reinterpret_cast<__half*>(a.scale) = scale_bits;
      return;
    }
  }
}

// One warp per (token, query head). Each lane holds head_dim / 32 elements of the query and
// of the output; keys are taken one at a time (the dot product reduced across the warp) with a
// streaming softmax, so memory holds no scores.
__global__ void PagedAttentionKernel(const SequenceDesc* seqs, int num_seqs, int64_t total_tokens,
                                     int num_heads, const int32_t* tables, KvPool pool, int layer,
                                     float scale) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= total_tokens * num_heads) return;
  const int64_t item = warp / num_heads;
  const int head = static_cast<int>(warp % num_heads);
  const SequenceDesc& s = seqs[FindSequence(seqs, num_seqs, item)];
  const int64_t t = item - s.first_item;
  const int64_t pos = s.start_pos + t;
  const int kv_head = head / (num_heads / pool.num_kv_heads);
  const int hd = pool.head_dim;
  const float* q = s.q + (t * num_heads + head) * hd;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + i * kWarp;
    qv[i] = d < hd ? q[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int32_t* table = tables + s.table_offset;
  for (int64_t p = 0; p <= pos; ++p) {
    const int64_t block = table[p / pool.block_size];
    if (block < 0) {  // evicted by a window: skip the rest of the block
      p += pool.block_size - 1 - p % pool.block_size;
      continue;
    }
    const int slot = static_cast<int>(p % pool.block_size);
    const KvRowAddress ka = LocateRow(pool, block, layer, kv_head, false, slot);
    const float k_scale = RowScale(ka);
    float dot = 0.0f;
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < hd) dot += qv[i] * LoadElement(ka, k_scale, d);
    }
    const float score = WarpSum(dot) * scale;
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float weight = expf(score - m_new);
    l = l * correction + weight;
    const KvRowAddress va = LocateRow(pool, block, layer, kv_head, true, slot);
    const float v_scale = RowScale(va);
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < hd) acc[i] = acc[i] * correction + weight * LoadElement(va, v_scale, d);
    }
    m = m_new;
  }
  float* out = s.out + (t * num_heads + head) * hd;
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < hd) out[d] = acc[i] * inv_l;
  }
}

int WarpBlocks(int64_t warps) {
  return static_cast<int>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void LaunchWriteKv(const float* k, const float* v, const SequenceDesc* seqs, int num_seqs,
                   int64_t total_tokens, const int32_t* tables, const KvPool& pool, int layer,
                   cudaStream_t stream) {
  const int64_t warps = total_tokens * 2 * pool.num_kv_heads;
  if (warps == 0) return;
  WriteKvKernel<<<WarpBlocks(warps), kWarpsPerBlock * kWarp, 0, stream>>>(
      k, v, seqs, num_seqs, total_tokens, tables, pool, layer);
}

void LaunchPagedAttention(const SequenceDesc* seqs, int num_seqs, int64_t total_tokens,
                          int num_heads, const int32_t* tables, const KvPool& pool, int layer,
                          float scale, cudaStream_t stream) {
  const int64_t warps = total_tokens * num_heads;
  if (warps == 0) return;
  PagedAttentionKernel<<<WarpBlocks(warps), kWarpsPerBlock * kWarp, 0, stream>>>(
      seqs, num_seqs, total_tokens, num_heads, tables, pool, layer, scale);
}

}  // namespace tandem::kernels::cuda
