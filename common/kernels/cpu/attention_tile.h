#pragma once

// The per-work-item math of PagedAttention: one chunk of keys against a tile of query rows,
// with a streaming softmax. Internal to common/kernels/cpu; split out so attention.cc holds only
// the paging and scheduling.

#include <cstdint>
#include <vector>

namespace tandem::kernels::internal {

// Keys per chunk: 64 x 128 dims x 4 B = 32 KiB each for K and V, about L1 + L2 friendly.
constexpr int kKeyChunk = 64;

// Thread-local working set of one work item. Rows are `dp` floats (head_dim rounded up to 8,
// zero-padded) so every dot product and update is whole AVX2 vectors.
struct AttentionScratch {
  std::vector<float> q;          // [rows][dp] queries, pre-multiplied by the softmax scale
  std::vector<float> o;          // [rows][dp] unnormalized output accumulators
  std::vector<float> k;          // [kKeyChunk][dp] keys of the current chunk, f32
  std::vector<float> v;          // [kKeyChunk][dp] values of the current chunk, f32
  std::vector<float> p;          // [rows][kKeyChunk] scores, then probabilities
  std::vector<float> max;        // [rows] running max of the scores
  std::vector<float> sum;        // [rows] running sum of exp(score - max)
  std::vector<float> alpha;      // [rows] rescale of o for the current chunk
  std::vector<int64_t> row_pos;  // [rows] sequence position of the row's token (causal limit)

  // Sizes the buffers and clears o, max, sum for a new item.
  void Reset(int rows, int dp);
};

// Folds keys/values at positions [c0, c0 + n) (already in scratch.k/v) into every row whose
// position is >= c0, each row seeing only positions <= its own.
void AttendChunk(AttentionScratch& s, int rows, int dp, int64_t c0, int n);

// AttendChunk runs AVX-512 loops where the CPU has AVX-512 (F, VL, DQ), else AVX2; both give the
// same bits. Asks for one or the other (tests, benchmarks); returns whether AVX-512 is now used.
bool UseAvx512Attention(bool use);

}  // namespace tandem::kernels::internal
