#pragma once

#include <cstdint>

#include "common/kernels/kernel_types.h"
#include "common/kv/kv_layout.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// Causal paged attention for one layer over a batch of sequences (prefill chunks and decode
// tokens alike): the token at position p attends to keys/values at positions 0..p of its own
// sequence, read from the blocks in its block table (their K/V for the new tokens must already
// be written). GQA: query head h uses KV head h / (num_heads / layout.num_kv_heads).
// `kv_base` is the start of the block pool; block b begins at kv_base + b * layout.BlockBytes().
// softmax(q.k * scale) in f32. Threads split (token, head) work items.
void PagedAttention(const AttentionSequence* seqs, int num_seqs, int num_heads,
                    const uint8_t* kv_base, const kv::KvLayout& layout, int layer, float scale,
                    ThreadPool& pool);
// The same over any pool, a mixed-precision one included: each block is read in its own layout.
void PagedAttention(const AttentionSequence* seqs, int num_seqs, int num_heads,
                    const kv::KvArena& arena, int layer, float scale, ThreadPool& pool);

// Writes K and V of `num_tokens` tokens ([num_tokens, num_kv_heads, head_dim] f32 each) at
// positions start_pos.. into their slots in the blocks of `block_table`, converting to
// layout.dtype.
void WriteKv(const float* k, const float* v, int num_tokens, int64_t start_pos,
             const int32_t* block_table, uint8_t* kv_base, const kv::KvLayout& layout, int layer);
void WriteKv(const float* k, const float* v, int num_tokens, int64_t start_pos,
             const int32_t* block_table, const kv::KvArena& arena, int layer);

}  // namespace tandem::kernels
