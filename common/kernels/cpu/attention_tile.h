#pragma once

// The per-work-item math of PagedAttention: one chunk of keys against a tile of query rows,
// with a streaming softmax. Internal to common/kernels/cpu; split out so attention.cc holds only
// the paging and scheduling.

#include <cstdint>
#include <vector>

namespace tandem::kernels::internal {

// Keys per chunk of the f32 loops: 64 x 128 dims x 4 B = 32 KiB each for K and V, about L1 + L2
// friendly.
constexpr int kF32KeyChunk = 64;
// Keys per chunk of the bf16 tiles, and the most a chunk has (the scratch rows' stride): each row
// tile's score and output accumulators are stored and reloaded once per chunk, and 128 keys halve
// that against 64 (BM_AttentionDecode path 2 1.05-1.09x, BM_AttentionPrefill2048 1.08-1.10x).
constexpr int kKeyChunk = 128;

// What the current chunk's key and value rows hold: f32 (rows gathered into scratch.k/v, or an
// f32 cache), or the cache's own bf16 or fp16 rows, read in place and widened in registers.
enum class KvRows { kF32, kBf16, kF16 };

// Thread-local working set of one work item. Rows are `dp` floats (head_dim rounded up to 8,
// zero-padded) so every dot product and update is whole AVX2 vectors.
struct AttentionScratch {
  std::vector<float> q;          // [rows][dp] queries, pre-multiplied by the softmax scale
  std::vector<float> o;          // [rows][dp] unnormalized output accumulators
  std::vector<float> k;          // [kKeyChunk][dp] keys of the current chunk, gathered to f32
  std::vector<float> v;          // [kKeyChunk][dp] values of the current chunk, gathered to f32
  // [kKeyChunk] where key (value) j of the current chunk starts: a row of scratch.k (v) or of
  // the cache, `dp` elements of the chunk's KvRows type. Rows past the chunk's keys point at
  // `zero_row` (or at stale scratch rows): their scores are computed and masked.
  std::vector<const void*> k_rows;
  std::vector<const void*> v_rows;
  std::vector<float> zero_row;   // [dp] zeros, wide enough for any KvRows type
  std::vector<float> p;          // [rows][kKeyChunk] scores, then probabilities
  std::vector<float> max;        // [rows] running max of the scores
  std::vector<float> sum;        // [rows] running sum of exp(score - max)
  std::vector<float> alpha;      // [rows] rescale of o for the current chunk
  std::vector<int64_t> row_pos;  // [rows] sequence position of the row's token (causal limit)
  // The bf16 tiles' (AttendChunkTiles) working set. o and the lane arrays above (max, sum,
  // alpha, row_pos) are sized to whole tiles of kTileLanes rows; the padding rows see no key.
  // There max is the reference o and sum are relative to, at most kRescaleGap below the
  // scores' running max (AttendChunk keeps o and sum relative to max too: the two mix).
  std::vector<uint16_t> q_tiles;  // [row tile][dp / 32][16 dim pairs][16 rows x 2]: q^T, bf16
  std::vector<uint16_t> k_copy;   // [kKeyChunk][dp] keys whose 16-row groups are not contiguous
  std::vector<uint16_t> v_tiles;  // [2][dp / 16][16 key pairs][16 dims x 2]: V, key-interleaved
  // Per row tile:
  std::vector<int32_t> lim;        // [16 rows] keys of the chunk the row sees (causal limit)
  std::vector<int32_t> tile_keys;  // keys of the chunk any of the tile's rows sees
  std::vector<float> s_t;          // [kKeyChunk][16 rows]: scores, then exps
  std::vector<uint16_t> p_tiles;   // [2][16 rows][32 keys]: probabilities, bf16

  // Sizes the buffers (k_rows and v_rows for `heads` KV heads) and clears o, max, sum for a new
  // item.
  void Reset(int rows, int dp, int heads = 1);
};

// Points k_rows/v_rows at scratch.k/v's rows, for a gathered chunk.
void PointAtGatheredRows(AttentionScratch& s, int dp);

// Folds keys/values at positions [c0, c0 + n) (rows of `type` at scratch.k_rows/v_rows) into
// every row whose position is >= c0, each row seeing only positions <= its own. Every type
// gives the bits the same values gathered to f32 give (the widening is exact).
void AttendChunk(AttentionScratch& s, KvRows type, int rows, int dp, int64_t c0, int n);

// Query rows per tile of the bf16 tile kernels.
constexpr int kTileLanes = 16;
// The most KV heads one work item of the tiles takes (decode: a token's GQA group per head).
constexpr int kMaxItemHeads = 8;

// Whether AttendChunkTiles runs: the CPU has AMX (and Linux lets this process use it) and
// head_dim is a multiple of 64.
bool AttentionTilesAvailable(int head_dim);

// The bf16 tile form of AttendChunk for rows of bf16 keys and values (the cache's own, where
// s.k_rows/v_rows point): q.k and p.v multiply on AMX tiles, q (as PrepareTileQueries rounded
// it) and the probabilities rounded to bf16, f32 sums. Each row's results depend on its own
// query and the chunk only (not on which tile or lane it sits in, nor on the other rows), so a
// sequence's bits do not depend on its batch or on how its prompt was chunked; they are not
// AttendChunk's. dp == head_dim, AttentionTilesAvailable(dp).
//
// An item may take `heads` (<= kMaxItemHeads) KV heads of one sequence at once, so that each
// step has several heads' tiles to run (decode items are one token's group, a few rows): the
// rows are then `heads` equal runs of whole row tiles, run h attending the keys and values at
// s.k_rows/v_rows[h * kKeyChunk...].
void AttendChunkTiles(AttentionScratch& s, int rows, int dp, int64_t c0, int n, int heads);
// Rounds s.q's rows to bf16 in the layout AttendChunkTiles reads and sizes its buffers for
// `heads` KV heads; once per work item, after s.q and s.row_pos are filled.
void PrepareTileQueries(AttentionScratch& s, int rows, int dp, int heads);

// AttendChunk runs AVX-512 loops where the CPU has AVX-512 (F, VL, DQ), else AVX2; both give the
// same bits. Asks for one or the other (tests, benchmarks); returns whether AVX-512 is now used.
bool UseAvx512Attention(bool use);

// PagedAttention reads bf16 and fp16 caches in place where head_dim is a multiple of 8 (the
// rows need no padding), else gathers to f32. Asks for one or the other (tests, benchmarks);
// returns the previous setting.
bool ReadKvInPlace(bool use);
// The most KV heads one item of the tiles takes (1..kMaxItemHeads; benchmarks compare 1 with
// the default, kMaxItemHeads); returns the previous setting.
int MaxItemHeads(int heads);
bool KvInPlace();

}  // namespace tandem::kernels::internal
