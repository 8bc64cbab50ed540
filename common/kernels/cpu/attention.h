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
//
// `math` kBf16Tiles multiplies q.k and p.v on AMX bf16 tiles where the CPU has them, head_dim is
// a multiple of 64 and the keys' blocks are bf16 (other blocks, and other CPUs, run the f32
// loops): q and the probabilities are rounded to bf16, sums stay f32. It is what model.cpu_gemm:
// onednn pairs with, whose GEMMs round their inputs to bf16 too. Either way a sequence's results
// do not depend on the batch it runs in or on how its prompt was chunked.
enum class AttentionMath { kF32, kBf16Tiles };
// Whether kBf16Tiles runs on tiles here for this head_dim (else it is kF32).
bool Bf16AttentionTiles(int head_dim);
void PagedAttention(const AttentionSequence* seqs, int num_seqs, int num_heads,
                    const uint8_t* kv_base, const kv::KvLayout& layout, int layer, float scale,
                    ThreadPool& pool, AttentionMath math = AttentionMath::kF32);
// The same over any pool, a mixed-precision one included: each block is read in its own layout.
void PagedAttention(const AttentionSequence* seqs, int num_seqs, int num_heads,
                    const kv::KvArena& arena, int layer, float scale, ThreadPool& pool,
                    AttentionMath math = AttentionMath::kF32);

// Writes K and V of `num_tokens` tokens ([num_tokens, num_kv_heads, head_dim] f32 each) at
// positions start_pos.. into their slots in the blocks of `block_table`, converting to
// layout.dtype.
void WriteKv(const float* k, const float* v, int num_tokens, int64_t start_pos,
             const int32_t* block_table, uint8_t* kv_base, const kv::KvLayout& layout, int layer);
void WriteKv(const float* k, const float* v, int num_tokens, int64_t start_pos,
             const int32_t* block_table, const kv::KvArena& arena, int layer);

}  // namespace tandem::kernels
