// Attention's products on AMX bf16 tiles: one chunk of kKeyChunk keys against the work item's
// query rows, in tiles of kTileLanes rows.
//
// Scores come out transposed, S^T = K Q^T: the keys are the A operand, read where the cache holds
// them (16 rows of a block at a time), and the queries the B operand, laid out once per item. So
// a score tile's row is one key against 16 query rows, and the streaming softmax runs across
// tile rows with one lane per query row: no horizontal reductions, and each lane does exactly
// the same operations whatever the other lanes hold. The probabilities are transposed back (a
// 16 x 16 transpose of bf16 pairs per 32 keys) into the A operand of P.V, whose B operand is the
// values with pairs of consecutive keys interleaved.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/kernels/cpu/amx.h"
#include "common/kernels/cpu/attention_tile.h"
#include "common/kernels/cpu/simd_avx512.h"
#include "common/util/dtype.h"

#define TANDEM_TILES \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace tandem::kernels::internal {
namespace {

constexpr int kLanes = kTileLanes;
// The tiles need head_dim in whole 32-dim blocks; at 32 (the bundled model) a chunk's fixed costs
// outweigh its products: decode attention at its serving batch measured 1.8x slower than the
// f32 loops (BM_AttentionDecodeBundled), where at 64 (Llama-3.2-1B) it is as fast and prefill
// 2.6x faster. So 64 or a multiple.
constexpr int kMinTileHeadDim = 64;
constexpr int kTileElems = 512;             // bf16 elements of one 16 x 64-byte tile
constexpr int kKeyGroups = kKeyChunk / 16;  // score tiles per row tile: 16 keys each
constexpr int kKeyBlocks = kKeyChunk / 32;  // P.V's K blocks: 32 keys (16 pairs) each
static_assert(kKeyGroups % 4 == 0, "ScoreTiles takes 4 groups of 16 keys a pass");
// How far a row's scores may rise above the max its o and sum are relative to before they are
// rescaled: probabilities stay below e^8 ~ 3000, far inside bf16's and f32's range.
constexpr float kRescaleGap = 8.0f;

// e^x for the softmax's exponents (x <= kRescaleGap, or masked off afterwards): Exp512's
// mantissa scaled by 2^n with scalef, which also takes the underflow to 0 that Exp512 clamps and
// masks for (no operand here overflows).
TANDEM_TILES inline __m512 ExpNonPositive(__m512 x) {
  __m512 n;
  const __m512 p = simd::ExpMantissa512(x, n);
  return _mm512_scalef_ps(p, n);
}

// out[c] (16 x 32 bits) = column c of in[0..15].
TANDEM_TILES void Transpose16(__m512i v[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  // u[4i + k]'s 128-bit lane L: rows 4i..4i+3 of column 4L + k.
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i x2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    v[k] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    v[4 + k] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    v[8 + k] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    v[12 + k] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
}

// Where the values of the item's KV head `slot` lie in the tiles' layout.
uint16_t* ValueTiles(AttentionScratch& s, int dp, int slot) {
  return s.v_tiles.data() + int64_t{slot} * kKeyBlocks * (dp / 16) * kTileElems;
}

// Where each group of 16 keys lies for the score tiles: in the cache where its rows are
// consecutive there, else copied to s.k_copy (rows past the chunk's keys are s.zero_row).
struct KeyGroups {
  const char* at[kKeyGroups];
  int64_t stride[kKeyGroups];
};

// For the item's KV head `slot` (its keys at s.k_rows[slot * kKeyChunk...]).
KeyGroups LocateKeys(AttentionScratch& s, int dp, int slot) {
  KeyGroups g;
  const int64_t row_bytes = int64_t{dp} * 2;
  const void* const* rows = s.k_rows.data() + slot * kKeyChunk;
  for (int i = 0; i < kKeyGroups; ++i) {
    const char* first = static_cast<const char*>(rows[16 * i]);
    bool consecutive = first != reinterpret_cast<const char*>(s.zero_row.data());
    for (int j = 1; j < 16 && consecutive; ++j) {
      consecutive = rows[16 * i + j] == first + j * row_bytes;
    }
    if (consecutive) {
      g.at[i] = first;
      g.stride[i] = row_bytes;
      continue;
    }
    uint16_t* copy = s.k_copy.data() + (int64_t{slot} * kKeyChunk + 16 * i) * dp;
    for (int j = 0; j < 16; ++j) std::memcpy(copy + int64_t{j} * dp, rows[16 * i + j], row_bytes);
    g.at[i] = reinterpret_cast<const char*>(copy);
    g.stride[i] = row_bytes;
  }
  return g;
}

// The chunk's values of the item's KV head `slot` as P.V's B operand (ValueTiles): per 32 keys
// and 16 dims, row kk holds keys 2kk and 2kk+1 interleaved, dim by dim.
TANDEM_TILES void InterleaveValues(AttentionScratch& s, int dp, int slot) {
  const int nt = dp / 16;
  const void* const* rows = s.v_rows.data() + slot * kKeyChunk;
  // Word 2d + i of a tile row: dim d (of 16) of key 2kk + i; b's words are 32 on.
  const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                       39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (int kb = 0; kb < kKeyBlocks; ++kb) {
    for (int kk = 0; kk < 16; ++kk) {
      const auto* a = static_cast<const uint16_t*>(rows[32 * kb + 2 * kk]);
      const auto* b = static_cast<const uint16_t*>(rows[32 * kb + 2 * kk + 1]);
      uint16_t* out = ValueTiles(s, dp, slot) + (int64_t{kb} * nt * 16 + kk) * 32;
      for (int h = 0; h < dp / 32; ++h) {
        const __m512i va = _mm512_loadu_si512(a + 32 * h);
        const __m512i vb = _mm512_loadu_si512(b + 32 * h);
        _mm512_storeu_si512(out + 2 * h * kTileElems, _mm512_permutex2var_epi16(va, low, vb));
        _mm512_storeu_si512(out + (2 * h + 1) * kTileElems,
                            _mm512_permutex2var_epi16(va, high, vb));
      }
    }
  }
}

// st[key][lane] = q_lane . k_key for the chunk's keys and one row tile's queries, 64 keys a pass.
TANDEM_TILES void ScoreTiles(const KeyGroups& k, const uint16_t* q_tiles, int dp, float* st) {
  for (int g = 0; g < kKeyGroups; g += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int db = 0; db < dp / 32; ++db) {
      const int64_t off = int64_t{db} * 64;  // bytes: 32 dims of a key row
      _tile_loadd(4, q_tiles + db * kTileElems, 64);
      _tile_loadd(5, k.at[g] + off, k.stride[g]);
      _tile_dpbf16ps(0, 5, 4);
      _tile_loadd(6, k.at[g + 1] + off, k.stride[g + 1]);
      _tile_dpbf16ps(1, 6, 4);
      _tile_loadd(7, k.at[g + 2] + off, k.stride[g + 2]);
      _tile_dpbf16ps(2, 7, 4);
      _tile_loadd(5, k.at[g + 3] + off, k.stride[g + 3]);
      _tile_dpbf16ps(3, 5, 4);
    }
    float* out = st + g * 16 * kLanes;
    _tile_stored(0, out, 64);
    _tile_stored(1, out + 16 * kLanes, 64);
    _tile_stored(2, out + 32 * kLanes, 64);
    _tile_stored(3, out + 48 * kLanes, 64);
  }
}

// Pairs of keys as bf16 pairs per lane: words 2i and 2i+1 of the result are lane i of `even`
// and of `odd`.
TANDEM_TILES inline __m512i KeyPairs(__m512 odd, __m512 even) {
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// SoftmaxTile where no lane's reference moves (every lane that sees keys of the chunk has seen
// keys before, and none of its scores here is more than kRescaleGap above its reference), as
// after a sequence's first chunks: one pass over the scores, the exponents going straight to
// p_tiles, st left as it is. Returns false, having changed nothing but p_tiles, where a lane's
// reference would move; SoftmaxTile then runs. The same operations per kept key as SoftmaxTile's
// (whose max pass would have left every reference where it is): the same bits.
TANDEM_TILES bool SoftmaxTileKeepingReferences(const float* st, __m512i limit, float* sum,
                                               const float* max, uint16_t* p_tiles) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 ref = _mm512_loadu_ps(max);
  const __mmask16 sees = _mm512_cmpgt_epi32_mask(limit, _mm512_setzero_si512());
  if ((sees & _mm512_cmp_ps_mask(ref, neg_inf, _CMP_EQ_OQ)) != 0) return false;
  const __m512 ceiling = _mm512_add_ps(ref, _mm512_set1_ps(kRescaleGap));
  __mmask16 over = 0;
  __m512 total = _mm512_setzero_ps();
  for (int kb = 0; kb < kKeyBlocks; ++kb) {
    __m512i w[16];
    for (int kk = 0; kk < 16; ++kk) {
      const int j = 32 * kb + 2 * kk;
      __m512 e[2];
      for (int i = 0; i < 2; ++i) {
        const __mmask16 keep = _mm512_cmpgt_epi32_mask(limit, _mm512_set1_epi32(j + i));
        const __m512 score = _mm512_loadu_ps(st + (j + i) * kLanes);
        over |= _mm512_mask_cmp_ps_mask(keep, score, ceiling, _CMP_GT_OQ);
        e[i] = _mm512_maskz_mov_ps(keep, ExpNonPositive(_mm512_sub_ps(score, ref)));
        total = _mm512_add_ps(total, e[i]);
      }
      w[kk] = KeyPairs(e[1], e[0]);
    }
    Transpose16(w);
    for (int r = 0; r < kLanes; ++r) _mm512_storeu_si512(p_tiles + kb * kTileElems + r * 32, w[r]);
  }
  if (over != 0) return false;
  _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), total));
  return true;
}

// The streaming softmax over one row tile's scores st[key][lane]: key j counts for lane l where
// j < lim[l] (the causal limit, 0 for a row that sees none of the chunk). o and sum are kept
// relative to each lane's reference max, which moves only where the chunk's max exceeds it by
// more than kRescaleGap (the lane's o row and sum are then rescaled here, o through memory);
// otherwise the exponents run up to e^kRescaleGap, and o needs no update outside the tiles.
// Leaves the probabilities as P.V's A operand in p_tiles (bf16, rows = lanes, keys past a
// lane's limit 0). Every decision is the lane's own, so a row's bits do not depend on the others.
TANDEM_TILES void SoftmaxTile(float* st, const int32_t* lim, int jmax, int rows, int dp, float* max,
                              float* sum, float* o, uint16_t* p_tiles) {
  const __m512i limit = _mm512_loadu_si512(lim);
  if (SoftmaxTileKeepingReferences(st, limit, sum, max, p_tiles)) return;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 mx = neg_inf;
  for (int j = 0; j < jmax; ++j) {
    const __mmask16 keep = _mm512_cmpgt_epi32_mask(limit, _mm512_set1_epi32(j));
    mx = _mm512_mask_max_ps(mx, keep, mx, _mm512_loadu_ps(st + j * kLanes));
  }
  const __m512 old_max = _mm512_loadu_ps(max);
  // Lanes with keys so far whose max grew past the gap: o and sum scale by e^(old - new).
  const __mmask16 rescale =
      _mm512_cmp_ps_mask(old_max, neg_inf, _CMP_NEQ_OQ) &
      _mm512_cmp_ps_mask(mx, _mm512_add_ps(old_max, _mm512_set1_ps(kRescaleGap)), _CMP_GT_OQ);
  // A lane's first keys set its reference (its o and sum are still 0).
  const __m512 ref =
      _mm512_mask_blend_ps(rescale | _mm512_cmp_ps_mask(old_max, neg_inf, _CMP_EQ_OQ), old_max, mx);
  if (rescale != 0) {
    alignas(64) float a[kLanes];
    _mm512_store_ps(a, ExpNonPositive(_mm512_sub_ps(old_max, ref)));
    _mm512_storeu_ps(sum, _mm512_mask_mul_ps(_mm512_loadu_ps(sum), rescale, _mm512_loadu_ps(sum),
                                             _mm512_load_ps(a)));
    for (int l = 0; l < kLanes && l < rows; ++l) {
      if ((rescale >> l & 1) == 0) continue;
      float* row = o + static_cast<int64_t>(l) * dp;
      const __m512 f = _mm512_set1_ps(a[l]);
      for (int d = 0; d < dp; d += 16) {
        _mm512_storeu_ps(row + d, _mm512_mul_ps(_mm512_loadu_ps(row + d), f));
      }
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (int j = 0; j < jmax; ++j) {
    const __mmask16 keep = _mm512_cmpgt_epi32_mask(limit, _mm512_set1_epi32(j));
    const __m512 e = _mm512_maskz_mov_ps(
        keep, ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(st + j * kLanes), ref)));
    total = _mm512_add_ps(total, e);
    _mm512_storeu_ps(st + j * kLanes, e);
  }
  for (int j = jmax; j < kKeyChunk; ++j) _mm512_storeu_ps(st + j * kLanes, _mm512_setzero_ps());
  _mm512_storeu_ps(max, ref);
  _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), total));

  // Pairs of keys as bf16 pairs per lane, then lanes to rows.
  for (int kb = 0; kb < kKeyBlocks; ++kb) {
    __m512i w[16];
    for (int kk = 0; kk < 16; ++kk) {
      const float* e = st + (32 * kb + 2 * kk) * kLanes;
      w[kk] = KeyPairs(_mm512_loadu_ps(e + kLanes), _mm512_loadu_ps(e));
    }
    Transpose16(w);
    for (int r = 0; r < kLanes; ++r) _mm512_storeu_si512(p_tiles + kb * kTileElems + r * 32, w[r]);
  }
}

// o[lane][*] += P.V for one row tile (o's rows dp floats apart, one per lane), accumulated in the
// tiles: o is loaded and stored exactly.
TANDEM_TILES void PvTiles(const uint16_t* p_tiles, const uint16_t* v_tiles, int dp, float* o) {
  const int nt = dp / 16;  // a multiple of 4: dp is a multiple of 64
  const int64_t stride = int64_t{dp} * 4;
  for (int t0 = 0; t0 < nt; t0 += 4) {
    _tile_loadd(0, o + 16 * t0, stride);
    _tile_loadd(1, o + 16 * (t0 + 1), stride);
    _tile_loadd(2, o + 16 * (t0 + 2), stride);
    _tile_loadd(3, o + 16 * (t0 + 3), stride);
    for (int kb = 0; kb < kKeyBlocks; ++kb) {
      const uint16_t* v = v_tiles + (int64_t{kb} * nt + t0) * kTileElems;
      _tile_loadd(4, p_tiles + kb * kTileElems, 64);
      _tile_loadd(5, v, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, v + kTileElems, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, v + 2 * kTileElems, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, v + 3 * kTileElems, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, o + 16 * t0, stride);
    _tile_stored(1, o + 16 * (t0 + 1), stride);
    _tile_stored(2, o + 16 * (t0 + 2), stride);
    _tile_stored(3, o + 16 * (t0 + 3), stride);
  }
}

bool CpuHasTileAttention() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16") && AmxTilesAllowed();
}

}  // namespace

bool AttentionTilesAvailable(int head_dim) {
  static_assert(kMinTileHeadDim % 64 == 0, "PvTiles takes 4 tiles of 16 dims at a time");
  static const bool cpu = CpuHasTileAttention();
  return cpu && head_dim > 0 && head_dim % kMinTileHeadDim == 0;
}

TANDEM_TILES void PrepareTileQueries(AttentionScratch& s, int rows, int dp, int heads) {
  const int tiles = (rows + kLanes - 1) / kLanes;
  const int nd = dp / 32;
  s.q_tiles.resize(static_cast<size_t>(tiles) * nd * kTileElems);
  // B operand of S^T = K Q^T: per 32 dims, row kk holds dims 2kk and 2kk+1 of the 16 rows, so
  // the rows' 32 bf16 dims are 16 pairs to transpose.
  for (int t = 0; t < tiles; ++t) {
    for (int db = 0; db < nd; ++db) {
      __m512i w[16];
      for (int l = 0; l < kLanes; ++l) {
        const int r = t * kLanes + l;
        const float* q = s.q.data() + static_cast<int64_t>(r) * dp + db * 32;
        w[l] = r < rows ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(q))
                        : _mm512_setzero_si512();
      }
      Transpose16(w);
      uint16_t* tile = s.q_tiles.data() + (static_cast<int64_t>(t) * nd + db) * kTileElems;
      for (int kk = 0; kk < 16; ++kk) _mm512_storeu_si512(tile + kk * 32, w[kk]);
    }
  }
  s.lim.resize(static_cast<size_t>(tiles) * kLanes);
  s.tile_keys.resize(tiles);
  s.k_copy.resize(static_cast<size_t>(heads) * kKeyChunk * dp);
  s.v_tiles.resize(static_cast<size_t>(heads) * kKeyBlocks * (dp / 16) * kTileElems);
  s.s_t.resize(static_cast<size_t>(tiles) * kKeyChunk * kLanes);
  s.p_tiles.resize(static_cast<size_t>(tiles) * kKeyBlocks * kTileElems);
}

TANDEM_TILES void AttendChunkTiles(AttentionScratch& s, int rows, int dp, int64_t c0, int n,
                                   int heads) {
  LoadTileConfig({16, 16, 16, 16, 16, 16, 16, 16});
  // Tile loads do not wake the hardware prefetchers: the keys are asked into L1 here, read by the
  // tiles after the values' vector loads (which the prefetchers follow) are laid out.
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < n; ++j) {
      const char* row = static_cast<const char*>(s.k_rows[h * kKeyChunk + j]);
      for (int b = 0; b < dp * 2; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    }
  }
  KeyGroups keys[kMaxItemHeads];
  for (int h = 0; h < heads; ++h) {
    keys[h] = LocateKeys(s, dp, h);
    InterleaveValues(s, dp, h);
  }
  const int nd = dp / 32;
  const int tiles = (rows + kLanes - 1) / kLanes;
  const int tiles_per_head = tiles / heads;
  // Each step runs for every row tile before the next step starts, so that what a step reads
  // through memory from another unit (vector stores to tile loads and back) was written a while
  // before; a row tile whose rows see none of the chunk sits out.
  int32_t* jmax = s.tile_keys.data();
  for (int t = 0; t < tiles; ++t) {
    jmax[t] = 0;
    for (int l = 0; l < kLanes; ++l) {
      int32_t& lim = s.lim[t * kLanes + l];
      lim = static_cast<int32_t>(std::clamp<int64_t>(s.row_pos[t * kLanes + l] - c0 + 1, 0, n));
      jmax[t] = std::max(jmax[t], lim);
    }
  }
  auto st = [&](int t) { return s.s_t.data() + static_cast<int64_t>(t) * kKeyChunk * kLanes; };
  auto pt = [&](int t) {
    return s.p_tiles.data() + static_cast<int64_t>(t) * kKeyBlocks * kTileElems;
  };
  auto o = [&](int t) { return s.o.data() + static_cast<int64_t>(t) * kLanes * dp; };
  for (int t = 0; t < tiles; ++t) {
    if (jmax[t] > 0) {
      ScoreTiles(keys[t / tiles_per_head], s.q_tiles.data() + int64_t{t} * nd * kTileElems, dp,
                 st(t));
    }
  }
  for (int t = 0; t < tiles; ++t) {
    if (jmax[t] == 0) continue;
    const int r0 = t * kLanes;
    SoftmaxTile(st(t), s.lim.data() + r0, jmax[t], rows - r0, dp, s.max.data() + r0,
                s.sum.data() + r0, o(t), pt(t));
  }
  // A row that sees none of the chunk has probabilities 0: its o gains exact zeros.
  for (int t = 0; t < tiles; ++t) {
    if (jmax[t] > 0) PvTiles(pt(t), ValueTiles(s, dp, t / tiles_per_head), dp, o(t));
  }
}

}  // namespace tandem::kernels::internal

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
