// Paged attention on the CPU.
//
// A work item is (sequence, KV head, tile of up to kTileTokens new tokens). Its query rows are
// every (token, query head) pair that shares the KV head, so each K/V chunk is read once for
// all of them (GQA groups in decode, token x group tiles in prefill). Keys are consumed in
// chunks of kF32KeyChunk positions (kKeyChunk on the bf16 tiles) across blocks, with a streaming
// ("online") softmax over chunks.
// A chunk's bf16, fp16 or f32 rows are read where they lie in the cache and widened in
// registers; int8 rows (and rows whose head_dim needs padding) are first gathered into f32
// rows. Either way the block size only decides where the rows are. Items are handed out
// dynamically, largest first, since causal items differ in cost by up to the context length.

#include "common/kernels/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "common/kernels/cpu/attention_tile.h"
#include "common/kv/kv_rows.h"
#include "common/util/check.h"
#include "common/util/dtype.h"

namespace tandem::kernels {
namespace {

using internal::AttentionScratch;
using internal::KvRows;

std::atomic<bool> kv_in_place{true};
std::atomic<int> max_item_heads{internal::kMaxItemHeads};

constexpr int kTargetRows = 32;  // query rows per item: enough K/V reuse, small enough tiles
// The bf16 tiles' items: 16 row tiles share each chunk's keys (asked into L1 once) and values (laid
// out for the tiles once), and each step of one row tile has the other tiles' work between it and
// the step that reads its results. BM_AttentionPrefill2048 path 2 (1B heads, 2 threads): 43.2 ms
// at 4 row tiles, 36.5 at 8, 34.5-35.0 at 16.
constexpr int kTargetTileRows = 256;
// Items of several KV heads take up to this many row tiles: a decode step's items (one row tile
// per head) ran 9-21% faster at 4 heads than at one in 6 of 7 runs (BM_AttentionDecode path 2
// against 3, 1B heads); 8 heads were no clearer.
constexpr int kItemHeadTiles = 4;
// Items of up to this many query rows (decode: one token's GQA group) read a chunk's rows in
// place: each key is widened once for the scores and at most twice for the values. Bigger
// tiles (prefill) pass over the chunk once per 4-8 rows, so they widen it once into f32 rows.
constexpr int kInPlaceMaxRows = 8;

struct WorkItem {
  int seq;
  int kv_head;   // the first KV head
  int kv_heads;  // KV heads kv_head.. (more than one only on the bf16 tiles)
  int t0;
  int t1;
  int64_t cost;  // ~ rows x keys, for largest-first ordering
};

// Block and row of token position `pos` of `head` (K if `v` is false).
struct RowAt {
  size_t block;
  kv::KvRowRef row;
};
RowAt Locate(const kv::KvLayout& layout, const int32_t* table, int layer, int head, bool v,
             int64_t pos) {
  return {static_cast<size_t>(table[pos / layout.block_size]),
          {layer, head, v, static_cast<int>(pos % layout.block_size)}};
}

// Calls fn(i, run, block, row) for each run of positions [p0 + i, p0 + i + run) of `head` (K if
// `v` is false) that lies contiguously in one block, starting at `row` of block number `block`.
template <typename Fn>
void ForEachRun(const kv::KvLayout& layout, const int32_t* table, int layer, int head, bool v,
                int64_t p0, int n, Fn&& fn) {
  for (int i = 0; i < n;) {
    const int64_t pos = p0 + i;
    const int run =
        static_cast<int>(std::min<int64_t>(n - i, layout.block_size - pos % layout.block_size));
    const RowAt at = Locate(layout, table, layer, head, v, pos);
    fn(i, run, at.block, at.row);
    i += run;
  }
}

// Dequantizes `run` int8 rows of `d` values starting at `q`, row r scaled by scales[r] (fp16),
// into rows of `dp` floats.
void DequantizeRows(const int8_t* q, const uint16_t* scales, int run, int d, int dp, float* dst) {
  for (int r = 0; r < run; ++r) {
    const __m256 scale = _mm256_set1_ps(F16ToF32(scales[r]));
    const int8_t* src = q + static_cast<int64_t>(r) * d;
    float* row = dst + static_cast<int64_t>(r) * dp;
    int i = 0;
    for (; i + 8 <= d; i += 8) {
      int64_t bytes;
      std::memcpy(&bytes, src + i, sizeof(bytes));
      const __m256i wide = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes));
      _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), scale));
    }
    const float s = F16ToF32(scales[r]);
    for (; i < d; ++i) row[i] = src[i] * s;
    std::fill(row + d, row + dp, 0.0f);
  }
}

// Converts K (or V) of positions [p0, p0 + n) to f32 rows of `dp` floats, zero-padded. Each
// block is read in its own layout (a mixed pool holds fp16 and int8 blocks).
void GatherChunk(const kv::KvArena& arena, const int32_t* table, int layer, int head, bool v,
                 int64_t p0, int n, int dp, float* dst) {
  const int d = arena.layout.head_dim;
  ForEachRun(
      arena.layout, table, layer, head, v, p0, n,
      [&](int i, int run, size_t block, const kv::KvRowRef& row) {
        const kv::KvLayout& layout = arena.LayoutOf(static_cast<int64_t>(block));
        const uint8_t* base = arena.Block(static_cast<int64_t>(block));
        const uint8_t* src = base + kv::KvRowOffset(layout, row);
        float* out = dst + static_cast<int64_t>(i) * dp;
        if (layout.dtype == DType::kI8) {
          DequantizeRows(reinterpret_cast<const int8_t*>(src),
                         reinterpret_cast<const uint16_t*>(base + kv::KvScaleOffset(layout, row)),
                         run, d, dp, out);
          return;
        }
        if (dp == d) {  // rows of a block are contiguous: one call per run
          ToFloat(layout.dtype, src, out, static_cast<size_t>(run) * d);
          return;
        }
        const size_t row_bytes = layout.RowBytes();
        for (int r = 0; r < run; ++r) {
          ToFloat(layout.dtype, src + r * row_bytes, out + static_cast<int64_t>(r) * dp, d);
          std::fill(out + static_cast<int64_t>(r) * dp + d, out + (r + 1) * int64_t{dp}, 0.0f);
        }
      });
}

// Where every block of positions [c0, c0 + n) of `head` holds rows of the pool's own float type,
// the rows need no padding (dp == head_dim) and the item is small enough (or `tiles` and bf16:
// the bf16 tiles read every chunk in place), points the chunk's key and value rows at the cache
// itself and returns their type; otherwise (int8 blocks, padded rows) nothing.
// The rows go to s.k_rows/v_rows[slot * kKeyChunk...].
std::optional<KvRows> PointAtCacheRows(const kv::KvArena& arena, const int32_t* table, int layer,
                                       int head, int64_t c0, int n, int rows, int dp, bool tiles,
                                       int slot, AttentionScratch& s) {
  const DType dtype = arena.layout.dtype;
  const bool any_rows = tiles && dtype == DType::kBF16;
  if ((rows > kInPlaceMaxRows && !any_rows) || dp != arena.layout.head_dim ||
      !kv_in_place.load(std::memory_order_relaxed)) {
    return {};
  }
  KvRows type;
  switch (dtype) {
    case DType::kF32:
      type = KvRows::kF32;
      break;
    case DType::kBF16:
      type = KvRows::kBf16;
      break;
    case DType::kF16:
      type = KvRows::kF16;
      break;
    default:
      return {};
  }
  bool same = true;
  for (bool v : {false, true}) {
    const void** at = (v ? s.v_rows : s.k_rows).data() + slot * internal::kKeyChunk;
    ForEachRun(arena.layout, table, layer, head, v, c0, n,
               [&](int i, int run, size_t block, const kv::KvRowRef& row) {
                 const kv::KvLayout& layout = arena.LayoutOf(static_cast<int64_t>(block));
                 if (layout.dtype != dtype) {  // an int8 block of a mixed-precision pool
                   same = false;
                   return;
                 }
                 const uint8_t* src =
                     arena.Block(static_cast<int64_t>(block)) + kv::KvRowOffset(layout, row);
                 for (int r = 0; r < run; ++r) at[i + r] = src + r * layout.RowBytes();
               });
  }
  if (!same) return {};
  for (int j = slot * internal::kKeyChunk + n; j < (slot + 1) * internal::kKeyChunk; ++j) {
    s.k_rows[j] = s.v_rows[j] = s.zero_row.data();
  }
  return type;
}

// Blocks are scattered, so each is a short stream the hardware prefetcher would only catch
// halfway through; requesting the next chunk into L2 while this one is computed hides that.
void PrefetchChunk(const kv::KvArena& arena, const int32_t* table, int layer, int head, int64_t p0,
                   int n) {
  for (bool v : {false, true}) {
    ForEachRun(arena.layout, table, layer, head, v, p0, n,
               [&](int, int run, size_t block, const kv::KvRowRef& row) {
                 const kv::KvLayout& layout = arena.LayoutOf(static_cast<int64_t>(block));
                 const char* base =
                     reinterpret_cast<const char*>(arena.Block(static_cast<int64_t>(block)));
                 const char* src = base + kv::KvRowOffset(layout, row);
                 for (size_t b = 0; b < run * layout.RowBytes(); b += 64) {
                   _mm_prefetch(src + b, _MM_HINT_T1);
                 }
                 if (layout.ScaleBytes() > 0) {
                   _mm_prefetch(base + kv::KvScaleOffset(layout, row), _MM_HINT_T1);
                 }
               });
  }
}

void RunItem(const WorkItem& item, const AttentionSequence& seq, int num_heads,
             const kv::KvArena& arena, int layer, float scale, bool tiles) {
  const kv::KvLayout& layout = arena.layout;
  const int group = num_heads / layout.num_kv_heads;
  const int d = layout.head_dim;
  const int dp = (d + 7) & ~7;
  const int head_rows = (item.t1 - item.t0) * group;
  // The tiles take each KV head's rows as whole row tiles; the rest are padding that sees no key.
  const int stride =
      tiles ? (head_rows + internal::kTileLanes - 1) / internal::kTileLanes * internal::kTileLanes
            : head_rows;
  const int rows = item.kv_heads * stride;
  thread_local AttentionScratch scratch;
  scratch.Reset(rows, dp, item.kv_heads);
  // Row h * stride + i (i < head_rows) is (token t0 + i / group, query head
  // (kv_head + h) * group + i % group).
  auto each_row = [&](auto&& fn) {
    for (int h = 0; h < item.kv_heads; ++h) {
      for (int i = 0; i < head_rows; ++i) {
        fn(h * stride + i, item.t0 + i / group, (item.kv_head + h) * group + i % group);
      }
    }
  };
  if (stride != head_rows) std::fill_n(scratch.q.begin(), static_cast<int64_t>(rows) * dp, 0.0f);
  each_row([&](int r, int t, int h) {
    const float* q = seq.q + (static_cast<int64_t>(t) * num_heads + h) * d;
    float* dst = scratch.q.data() + static_cast<int64_t>(r) * dp;
    for (int i = 0; i < d; ++i) dst[i] = q[i] * scale;
    std::fill(dst + d, dst + dp, 0.0f);
    scratch.row_pos[r] = seq.start_pos + t;
  });
  if (tiles) internal::PrepareTileQueries(scratch, rows, dp, item.kv_heads);
  const int64_t end_pos = seq.start_pos + item.t1;  // one past the last key any row needs
  const int64_t bs = layout.block_size;
  const int32_t* table = seq.block_table;
  // The tiles' chunks where the pool is bf16; one of its int8 blocks (a mixed-precision pool)
  // falls back to the f32 loops, which take any count up to kKeyChunk.
  const int chunk =
      tiles && layout.dtype == DType::kBF16 ? internal::kKeyChunk : internal::kF32KeyChunk;
  // Keys come in runs of live blocks: a sliding or elastic window may have evicted some
  // (kNoBlock). Chunks keep their true positions, for the causal mask.
  for (int64_t run0 = 0; run0 < end_pos;) {
    if (table[run0 / bs] == kv::kNoBlock) {
      run0 = (run0 / bs + 1) * bs;
      continue;
    }
    int64_t run1 = (run0 / bs + 1) * bs;
    while (run1 < end_pos && table[run1 / bs] != kv::kNoBlock) run1 += bs;
    run1 = std::min(run1, end_pos);
    for (int64_t c0 = run0; c0 < run1; c0 += chunk) {
      const int n = static_cast<int>(std::min<int64_t>(chunk, run1 - c0));
      const int64_t next = c0 + chunk;
      for (int h = 0; h < item.kv_heads && next < run1; ++h) {
        PrefetchChunk(arena, table, layer, item.kv_head + h, next,
                      static_cast<int>(std::min<int64_t>(chunk, run1 - next)));
      }
      if (item.kv_heads > 1) {  // bf16 blocks throughout (MakeItems): read in place
        for (int h = 0; h < item.kv_heads; ++h) {
          const std::optional<KvRows> type = PointAtCacheRows(arena, table, layer, item.kv_head + h,
                                                              c0, n, rows, dp, tiles, h, scratch);
          TANDEM_CHECK(type == KvRows::kBf16, "items of several KV heads read bf16 blocks");
        }
        internal::AttendChunkTiles(scratch, rows, dp, c0, n, item.kv_heads);
        continue;
      }
      std::optional<KvRows> type =
          PointAtCacheRows(arena, table, layer, item.kv_head, c0, n, rows, dp, tiles, 0, scratch);
      if (tiles && type == KvRows::kBf16) {
        internal::AttendChunkTiles(scratch, rows, dp, c0, n, 1);
        continue;
      }
      if (!type) {
        GatherChunk(arena, table, layer, item.kv_head, false, c0, n, dp, scratch.k.data());
        GatherChunk(arena, table, layer, item.kv_head, true, c0, n, dp, scratch.v.data());
        internal::PointAtGatheredRows(scratch, dp);
        type = KvRows::kF32;
      }
      internal::AttendChunk(scratch, *type, head_rows, dp, c0, n);
    }
    run0 = run1;
  }
  each_row([&](int r, int t, int h) {
    float* out = seq.out + (static_cast<int64_t>(t) * num_heads + h) * d;
    const float* o = scratch.o.data() + static_cast<int64_t>(r) * dp;
    const float inv = 1.0f / scratch.sum[r];
    for (int i = 0; i < d; ++i) out[i] = o[i] * inv;
  });
}

// Whether every live block of `table` up to position `end` is of the pool's own layout (none is
// an int8 block of a mixed-precision pool).
bool AllWide(const kv::KvArena& arena, const int32_t* table, int64_t end) {
  const int64_t bs = arena.layout.block_size;
  for (int64_t b = 0; b * bs < end; ++b) {
    if (table[b] != kv::kNoBlock && arena.IsNarrow(table[b])) return false;
  }
  return true;
}

// Items of up to `target_rows` query rows per KV head: a run of a sequence's tokens for one KV
// head, or, where `max_heads` > 1 and the sequence's blocks are all of the pool's own layout, for
// as many consecutive KV heads (at most max_heads) as fit kItemHeadTiles row tiles of the bf16
// tiles (decode: a token's group per head).
std::vector<WorkItem> MakeItems(const AttentionSequence* seqs, int num_seqs,
                                const kv::KvArena& arena, int group, int target_rows,
                                int max_heads) {
  const int num_kv_heads = arena.layout.num_kv_heads;
  const int tile_tokens = std::max(1, target_rows / group);
  std::vector<WorkItem> items;
  for (int s = 0; s < num_seqs; ++s) {
    const bool wide = max_heads > 1 &&
                      AllWide(arena, seqs[s].block_table, seqs[s].start_pos + seqs[s].num_tokens);
    for (int t0 = 0; t0 < seqs[s].num_tokens; t0 += tile_tokens) {
      const int t1 = std::min(seqs[s].num_tokens, t0 + tile_tokens);
      const int head_tiles = ((t1 - t0) * group + internal::kTileLanes - 1) / internal::kTileLanes;
      const int per_item = wide ? std::clamp(kItemHeadTiles / head_tiles, 1, max_heads) : 1;
      const int64_t cost = static_cast<int64_t>(t1 - t0) * group * (seqs[s].start_pos + t1);
      for (int h = 0; h < num_kv_heads; h += per_item) {
        const int heads = std::min(per_item, num_kv_heads - h);
        items.push_back({s, h, heads, t0, t1, cost * heads});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return items;
}

}  // namespace

void PagedAttention(const AttentionSequence* seqs, int num_seqs, int num_heads,
                    const uint8_t* kv_base, const kv::KvLayout& layout, int layer, float scale,
                    ThreadPool& pool, AttentionMath math) {
  PagedAttention(seqs, num_seqs, num_heads,
                 kv::KvArena{.base = const_cast<uint8_t*>(kv_base), .layout = layout}, layer, scale,
                 pool, math);
}

void PagedAttention(const AttentionSequence* seqs, int num_seqs, int num_heads,
                    const kv::KvArena& arena, int layer, float scale, ThreadPool& pool,
                    AttentionMath math) {
  const kv::KvLayout& layout = arena.layout;
  const int group = num_heads / layout.num_kv_heads;
  const bool tiles = math == AttentionMath::kBf16Tiles &&
                     internal::AttentionTilesAvailable(layout.head_dim) &&
                     kv_in_place.load(std::memory_order_relaxed);
  // Several KV heads per item on the tiles (for sequences whose blocks are all bf16, read in
  // place), as long as there are items enough for every thread twice over.
  const int max_heads = tiles && layout.dtype == DType::kBF16
                            ? std::clamp(num_seqs * layout.num_kv_heads / (2 * pool.num_threads()),
                                         1, max_item_heads.load(std::memory_order_relaxed))
                            : 1;
  const std::vector<WorkItem> items =
      MakeItems(seqs, num_seqs, arena, group, tiles ? kTargetTileRows : kTargetRows, max_heads);
  auto run = [&](const WorkItem& item) {
    RunItem(item, seqs[item.seq], num_heads, arena, layer, scale, tiles);
  };
  if (items.size() <= 1 || pool.num_threads() == 1) {
    for (const WorkItem& item : items) run(item);
    return;
  }
  // ParallelFor splits statically; a shared counter balances items of very different cost.
  std::atomic<size_t> next{0};
  pool.ParallelFor(pool.num_threads(), 1, [&](int64_t, int64_t) {
    for (size_t i = next.fetch_add(1); i < items.size(); i = next.fetch_add(1)) run(items[i]);
  });
}

void WriteKv(const float* k, const float* v, int num_tokens, int64_t start_pos,
             const int32_t* block_table, uint8_t* kv_base, const kv::KvLayout& layout, int layer) {
  WriteKv(k, v, num_tokens, start_pos, block_table, kv::KvArena{.base = kv_base, .layout = layout},
          layer);
}

void WriteKv(const float* k, const float* v, int num_tokens, int64_t start_pos,
             const int32_t* block_table, const kv::KvArena& arena, int layer) {
  const kv::KvLayout& layout = arena.layout;
  const int d = layout.head_dim;
  for (int t = 0; t < num_tokens; ++t) {
    const int64_t pos = start_pos + t;
    for (int h = 0; h < layout.num_kv_heads; ++h) {
      const int64_t src = (static_cast<int64_t>(t) * layout.num_kv_heads + h) * d;
      for (bool value : {false, true}) {
        const RowAt at = Locate(layout, block_table, layer, h, value, pos);
        const auto block = static_cast<int64_t>(at.block);
        kv::WriteKvRow(arena.Block(block), arena.LayoutOf(block), at.row, (value ? v : k) + src);
      }
    }
  }
}

bool Bf16AttentionTiles(int head_dim) { return internal::AttentionTilesAvailable(head_dim); }

namespace internal {

bool ReadKvInPlace(bool use) { return kv_in_place.exchange(use); }
int MaxItemHeads(int heads) { return max_item_heads.exchange(std::clamp(heads, 1, kMaxItemHeads)); }
bool KvInPlace() { return kv_in_place.load(); }

}  // namespace internal

}  // namespace tandem::kernels
