#include "common/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/kernels/cpu/attention_tile.h"
#include "common/kv/kv_layout.h"
#include "common/util/dtype.h"
#include "common/util/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::kernels {
namespace {

constexpr int kLayers = 2;
constexpr int kLayer = 1;  // not layer 0, so the per-layer offset is exercised

struct SeqSpec {
  int64_t start_pos;  // tokens already in the cache
  int num_tokens;     // new tokens attended in this call
};

// One sequence's full history: K/V of every position as f32 and as rounded to the cache dtype.
struct SeqData {
  SeqSpec spec;
  std::vector<int32_t> blocks;
  std::vector<float> k, v;  // [positions][kv_heads][head_dim], already rounded to the dtype
  std::vector<float> q;     // [num_tokens][heads][head_dim]
  std::vector<float> out;
  std::vector<bool> evicted;  // per block: dropped by a window (kNoBlock in the table)
};

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// The values a cache of `dtype` holds for x (rows of d values). int8, from its definition: each
// row scaled by s = fp16(max |x| / 127), rounded to the nearest integer, clamped to +-127.
std::vector<float> RoundTrip(DType dtype, const std::vector<float>& x, int d) {
  if (dtype == DType::kI8) {
    std::vector<float> back(x.size());
    for (size_t r = 0; r < x.size(); r += d) {
      double max_abs = 0;
      for (int i = 0; i < d; ++i) max_abs = std::max(max_abs, std::fabs(double{x[r + i]}));
      const double s = F16ToF32(F32ToF16(static_cast<float>(max_abs / 127)));
      for (int i = 0; i < d; ++i) {
        const double q = s == 0 ? 0 : std::clamp(std::nearbyint(x[r + i] / s), -127.0, 127.0);
        back[r + i] = static_cast<float>(q * s);
      }
    }
    return back;
  }
  std::vector<uint8_t> stored(x.size() * DTypeSize(dtype));
  FromFloat(dtype, x.data(), stored.data(), x.size());
  std::vector<float> back(x.size());
  ToFloat(dtype, stored.data(), back.data(), x.size());
  return back;
}

// Double-precision causal softmax attention of one new token over positions 0..pos. With
// `round_q`, q * scale is first rounded to bf16, as the bf16 tiles round it.
std::vector<double> Reference(const SeqData& s, const kv::KvLayout& layout, int heads, int t, int h,
                              float scale, bool round_q) {
  const int d = layout.head_dim;
  const int kvh = h / (heads / layout.num_kv_heads);
  const int64_t pos = s.spec.start_pos + t;
  const float* q = s.q.data() + (static_cast<int64_t>(t) * heads + h) * d;
  auto live = [&](int64_t p) { return s.evicted.empty() || !s.evicted[p / layout.block_size]; };
  std::vector<double> scores(pos + 1, -1e300);
  for (int64_t p = 0; p <= pos; ++p) {
    if (!live(p)) continue;
    const float* k = s.k.data() + (p * layout.num_kv_heads + kvh) * d;
    double dot = 0;
    for (int i = 0; i < d; ++i) {
      dot +=
          (round_q ? Bf16ToF32(F32ToBf16(q[i] * scale)) : static_cast<double>(q[i]) * scale) * k[i];
    }
    scores[p] = dot;
  }
  const double mx = *std::max_element(scores.begin(), scores.end());
  double total = 0;
  for (int64_t p = 0; p <= pos; ++p) total += (scores[p] = live(p) ? std::exp(scores[p] - mx) : 0);
  std::vector<double> out(d, 0.0);
  for (int64_t p = 0; p <= pos; ++p) {
    const float* v = s.v.data() + (p * layout.num_kv_heads + kvh) * d;
    for (int i = 0; i < d; ++i) out[i] += scores[p] / total * v[i];
  }
  return out;
}

// The values the cache holds for K or V rows [positions][kv_heads][head_dim]: each position
// rounded as its block's layout stores it.
std::vector<float> RoundTripRows(const kv::KvArena& arena, const std::vector<int32_t>& blocks,
                                 const std::vector<float>& x) {
  const kv::KvLayout& layout = arena.layout;
  const size_t row = static_cast<size_t>(layout.num_kv_heads) * layout.head_dim;
  std::vector<float> out;
  for (size_t p = 0; p * row < x.size(); ++p) {
    const std::vector<float> rows(x.begin() + p * row, x.begin() + (p + 1) * row);
    const DType dtype = arena.LayoutOf(blocks[p / layout.block_size]).dtype;
    const std::vector<float> back = RoundTrip(dtype, rows, layout.head_dim);
    out.insert(out.end(), back.begin(), back.end());
  }
  return out;
}

// Builds a pool, writes every sequence's cache with WriteKv (history and new tokens in separate
// calls, as chunked prefill does), runs PagedAttention and compares with the reference. With
// `mixed`, the first half of the pool's blocks are of `layout` and the rest int8 (a
// mixed-precision cache), and every table mixes both. With `evict`, every third block wholly
// before a sequence's new tokens becomes kNoBlock (a window dropped it) and must not be attended.
// Returns every sequence's output.
// kBf16Tiles (`math`) rounds q and the probabilities to bf16: its outputs (averages of values in
// [-1, 1]) are held to kTilesTolerance, the f32 loops' to kF32Tolerance. Where the tiles run on
// every chunk, the reference rounds q as they do, so that what is left is the probabilities'
// rounding, whatever the scores' size. `key_growth` scales the keys at position p by
// 1 + key_growth * p: scores that keep rising past the max o was kept relative to.
constexpr double kF32Tolerance = 2e-5;
constexpr double kTilesTolerance = 5e-3;

std::vector<std::vector<float>> RunAndCheck(const kv::KvLayout& layout, int heads,
                                            const std::vector<SeqSpec>& specs, ThreadPool& pool,
                                            uint32_t seed, bool mixed = false, bool evict = false,
                                            AttentionMath math = AttentionMath::kF32,
                                            float key_growth = 0.0f) {
  SCOPED_TRACE(::testing::Message()
               << "dtype=" << DTypeName(layout.dtype) << (mixed ? "+int8" : "") << " block="
               << layout.block_size << " head_dim=" << layout.head_dim << " heads=" << heads
               << " kv_heads=" << layout.num_kv_heads << " threads=" << pool.num_threads()
               << (math == AttentionMath::kBf16Tiles ? " bf16 tiles" : ""));
  const double tolerance = math == AttentionMath::kF32 ? kF32Tolerance : kTilesTolerance;
  const bool round_q = math == AttentionMath::kBf16Tiles && layout.dtype == DType::kBF16 &&
                       !mixed && internal::AttentionTilesAvailable(layout.head_dim);
  std::mt19937 rng(seed);
  const int d = layout.head_dim;
  const int kvh = layout.num_kv_heads;
  int total_blocks = 0;
  for (const SeqSpec& s : specs) {
    total_blocks +=
        static_cast<int>((s.start_pos + s.num_tokens + layout.block_size - 1) / layout.block_size);
  }
  // Blocks are handed out shuffled so no table is contiguous or ordered.
  std::vector<int32_t> ids(total_blocks + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  kv::KvArena arena{.layout = layout};
  std::vector<uint8_t> kv_pool(ids.size() * layout.BlockBytes(), 0xff);  // NaN-ish garbage
  arena.base = kv_pool.data();
  if (mixed) {
    arena.num_wide = static_cast<int64_t>(ids.size() / 2);
    arena.narrow = layout;
    arena.narrow.dtype = DType::kI8;
  }

  std::vector<SeqData> seqs(specs.size());
  size_t next_id = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    SeqData& s = seqs[i];
    s.spec = specs[i];
    const int64_t len = s.spec.start_pos + s.spec.num_tokens;
    s.blocks.assign(ids.begin() + next_id,
                    ids.begin() + next_id + (len + layout.block_size - 1) / layout.block_size);
    next_id += s.blocks.size();
    std::vector<float> k = RandomVector(len * kvh * d, rng);
    std::vector<float> v = RandomVector(len * kvh * d, rng);
    for (size_t i = 0; i < k.size(); ++i) k[i] *= 1.0f + key_growth * (i / (kvh * d));
    s.q = RandomVector(static_cast<size_t>(s.spec.num_tokens) * heads * d, rng);
    s.out.assign(s.q.size(), -7.0f);
    const int64_t split = s.spec.start_pos * kvh * d;
    if (mixed) {
      WriteKv(k.data(), v.data(), static_cast<int>(s.spec.start_pos), 0, s.blocks.data(), arena,
              kLayer);
      WriteKv(k.data() + split, v.data() + split, s.spec.num_tokens, s.spec.start_pos,
              s.blocks.data(), arena, kLayer);
    } else {
      WriteKv(k.data(), v.data(), static_cast<int>(s.spec.start_pos), 0, s.blocks.data(),
              kv_pool.data(), layout, kLayer);
      WriteKv(k.data() + split, v.data() + split, s.spec.num_tokens, s.spec.start_pos,
              s.blocks.data(), kv_pool.data(), layout, kLayer);
    }
    s.k = RoundTripRows(arena, s.blocks, k);
    s.v = RoundTripRows(arena, s.blocks, v);
    if (evict) {
      s.evicted.assign(s.blocks.size(), false);
      for (size_t b = 1; (b + 1) * layout.block_size <= static_cast<size_t>(s.spec.start_pos);
           b += 3) {
        s.evicted[b] = true;
        s.blocks[b] = kv::kNoBlock;
      }
    }
  }
  std::vector<AttentionSequence> batch;
  for (SeqData& s : seqs) {
    batch.push_back(
        {s.q.data(), s.out.data(), s.spec.num_tokens, s.spec.start_pos, s.blocks.data()});
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  if (mixed) {
    PagedAttention(batch.data(), static_cast<int>(batch.size()), heads, arena, kLayer, scale, pool,
                   math);
  } else {
    PagedAttention(batch.data(), static_cast<int>(batch.size()), heads, kv_pool.data(), layout,
                   kLayer, scale, pool, math);
  }

  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqData& s = seqs[i];
    for (int t = 0; t < s.spec.num_tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const std::vector<double> ref = Reference(s, layout, heads, t, h, scale, round_q);
        const float* out = s.out.data() + (static_cast<int64_t>(t) * heads + h) * d;
        for (int c = 0; c < d; ++c) {
          EXPECT_NEAR(out[c], ref[c], tolerance)
              << "seq=" << i << " token=" << t << " head=" << h << " dim=" << c;
          if (std::abs(out[c] - ref[c]) > tolerance) return {};
        }
      }
    }
  }
  std::vector<std::vector<float>> outs;
  for (const SeqData& s : seqs) outs.push_back(s.out);
  return outs;
}

// Several sequences per call: fresh prefill, chunked prefill onto a cache, decode tokens.
const std::vector<SeqSpec> kMixedBatch = {{0, 37}, {20, 1}, {45, 13}, {0, 1}, {100, 1}, {3, 70}};

using Config = std::tuple<DType, int /*block_size*/, std::pair<int, int> /*heads, kv_heads*/>;

class PagedAttentionTest : public ::testing::TestWithParam<Config> {};

TEST_P(PagedAttentionTest, MixedBatchMatchesReference) {
  const auto [dtype, block_size, heads] = GetParam();
  kv::KvLayout layout{kLayers, heads.second, 64, block_size, dtype};
  ThreadPool two(2);
  ThreadPool three(3);
  RunAndCheck(layout, heads.first, kMixedBatch, two, 1);
  RunAndCheck(layout, heads.first, kMixedBatch, three, 2);
}

INSTANTIATE_TEST_SUITE_P(
    AllKvDtypes, PagedAttentionTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kI8),
                       ::testing::Values(16, 5, 1),
                       ::testing::Values(std::pair{8, 2} /*GQA*/, std::pair{4, 1} /*MQA*/,
                                         std::pair{3, 3} /*MHA*/)));

// A mixed-precision cache: every table holds fp16 (or bf16) and int8 blocks, each read in its
// own layout.
TEST(PagedAttentionMixedTest, TablesMixingFp16AndInt8BlocksMatchReference) {
  ThreadPool pool(2);
  for (DType wide : {DType::kF16, DType::kBF16}) {
    for (int block_size : {16, 5}) {
      for (int head_dim : {64, 20}) {
        kv::KvLayout layout{kLayers, 2, head_dim, block_size, wide};
        RunAndCheck(layout, 8, kMixedBatch, pool, 11, /*mixed=*/true);
        RunAndCheck(layout, 8, {{150, 160}, {300, 1}}, pool, 12, /*mixed=*/true);
      }
    }
  }
}

// Tables with holes (blocks a sliding or elastic window evicted): attention skips them and keeps
// every other key at its position.
TEST(PagedAttentionEvictedTest, EvictedBlocksAreSkipped) {
  ThreadPool pool(2);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kI8}) {
    for (int block_size : {16, 5}) {
      kv::KvLayout layout{kLayers, 2, 64, block_size, dtype};
      RunAndCheck(layout, 8, {{150, 60}, {300, 1}, {45, 13}, {0, 20}}, pool, 21, false, true);
    }
  }
  kv::KvLayout layout{kLayers, 2, 64, 16, DType::kF16};
  RunAndCheck(layout, 8, {{200, 30}, {400, 1}}, pool, 22, /*mixed=*/true, /*evict=*/true);
}

TEST(PagedAttentionHeadDimTest, OddHeadDims) {
  ThreadPool pool(2);
  for (DType dtype : {DType::kBF16, DType::kI8}) {
    for (int head_dim : {32, 48, 80, 128, 20, 3}) {
      kv::KvLayout layout{kLayers, 2, head_dim, 16, dtype};
      RunAndCheck(layout, 8, {{0, 9}, {30, 1}, {17, 20}}, pool, head_dim);
    }
  }
}

// AttendChunk's AVX-512 loops give the AVX2 loops' bits: prefill tiles, chunked prefill onto a
// cache, decode rows, head dims whose rows are not whole zmm registers.
TEST(PagedAttentionIsaTest, Avx512AndAvx2GiveTheSameBits) {
  if (!internal::UseAvx512Attention(true)) GTEST_SKIP() << "no AVX-512 on this CPU";
  ThreadPool pool(2);
  for (int head_dim : {64, 40, 128, 20}) {
    kv::KvLayout layout{kLayers, 2, head_dim, 16, DType::kBF16};
    const std::vector<SeqSpec> specs = {{150, 160}, {0, 37}, {45, 13}, {300, 1}};
    const auto wide = RunAndCheck(layout, 8, specs, pool, 9);
    internal::UseAvx512Attention(false);
    const auto narrow = RunAndCheck(layout, 8, specs, pool, 9);
    internal::UseAvx512Attention(true);
    ASSERT_FALSE(wide.empty());
    EXPECT_TRUE(wide == narrow) << "head_dim " << head_dim;
  }
}

// Rows read in place from the cache (widened in registers) give the bits of the same rows
// gathered to f32 first, on both ISAs: every float dtype, blocks shorter and longer than a key
// chunk, GQA/MQA/MHA, a mixed-precision pool (chunks holding int8 blocks are gathered), tables
// with evicted blocks.
TEST(PagedAttentionInPlaceTest, RowsReadInPlaceGiveTheGatheredBits) {
  ThreadPool pool(2);
  const bool had_avx512 = internal::UseAvx512Attention(true);
  struct Case {
    DType dtype;
    int block_size, head_dim, heads, kv_heads;
    bool mixed, evict;
  };
  const std::vector<Case> cases = {
      {DType::kBF16, 16, 64, 8, 2, false, false}, {DType::kF16, 16, 64, 8, 2, false, false},
      {DType::kF32, 16, 64, 8, 2, false, false},  {DType::kBF16, 5, 32, 4, 2, false, false},
      {DType::kBF16, 1, 40, 4, 1, false, false},  {DType::kF16, 128, 128, 3, 3, false, false},
      {DType::kBF16, 16, 64, 8, 2, true, false},  {DType::kF16, 16, 64, 8, 2, false, true},
      {DType::kBF16, 16, 64, 8, 1, false, false}, {DType::kBF16, 16, 48, 2, 2, false, false},
  };
  // Decode rows (one token's group) and a 7-token tile (7 rows of MHA) are read in place; the
  // bigger prefill tiles are gathered, in the same call.
  const std::vector<SeqSpec> specs = {{150, 160}, {0, 37}, {45, 13}, {300, 1}, {63, 1}, {45, 7}};
  for (bool avx512 : {true, false}) {
    if (avx512 && !had_avx512) continue;
    internal::UseAvx512Attention(avx512);
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(c.dtype) << " block " << c.block_size << " head_dim " << c.head_dim
                   << " heads " << c.heads << "/" << c.kv_heads << (c.mixed ? " mixed" : "")
                   << (c.evict ? " evicted" : "") << (avx512 ? " avx512" : " avx2"));
      kv::KvLayout layout{kLayers, c.kv_heads, c.head_dim, c.block_size, c.dtype};
      ASSERT_TRUE(internal::KvInPlace());
      const auto in_place = RunAndCheck(layout, c.heads, specs, pool, 31, c.mixed, c.evict);
      internal::ReadKvInPlace(false);
      const auto gathered = RunAndCheck(layout, c.heads, specs, pool, 31, c.mixed, c.evict);
      internal::ReadKvInPlace(true);
      ASSERT_FALSE(in_place.empty());
      EXPECT_TRUE(in_place == gathered);
    }
  }
  internal::UseAvx512Attention(had_avx512);
}

// AttendChunk on a chunk's bf16 or fp16 rows, wherever they lie, gives the bits of the same rows
// widened to f32 first: every row count (all of the 8/4/2/1-row loops), head dims that are and
// are not whole zmm registers, chunks shorter than a multiple of 4 keys, both ISAs.
TEST(AttendChunkTest, SixteenBitRowsGiveTheWidenedRowsBits) {
  const bool had_avx512 = internal::UseAvx512Attention(true);
  std::mt19937 rng(41);
  for (bool avx512 : {true, false}) {
    if (avx512 && !had_avx512) continue;
    internal::UseAvx512Attention(avx512);
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      for (int dp : {32, 40, 64, 128}) {
        for (int rows : {1, 2, 3, 5, 8, 9}) {
          for (int n : {64, 37, 1}) {
            SCOPED_TRACE(::testing::Message()
                         << DTypeName(dtype) << " dp " << dp << " rows " << rows << " keys " << n);
            // Keys and values in 16 bits, each row somewhere of its own in a larger buffer.
            const std::vector<float> kf = RandomVector(2 * internal::kKeyChunk * dp, rng);
            const std::vector<float> vf = RandomVector(2 * internal::kKeyChunk * dp, rng);
            std::vector<uint16_t> k16(kf.size()), v16(vf.size());
            FromFloat(dtype, kf.data(), k16.data(), kf.size());
            FromFloat(dtype, vf.data(), v16.data(), vf.size());
            const std::vector<float> q = RandomVector(static_cast<size_t>(rows) * dp, rng);
            auto run = [&](bool widened) {
              internal::AttentionScratch s;
              s.Reset(rows, dp);
              std::copy(q.begin(), q.end(), s.q.begin());
              for (int r = 0; r < rows; ++r) s.row_pos[r] = 1000 + r;  // every key visible
              for (int j = 0; j < n; ++j) {
                const int64_t at = static_cast<int64_t>(2 * j + (j % 3 == 0)) * dp;
                if (widened) {
                  ToFloat(dtype, k16.data() + at, s.k.data() + static_cast<int64_t>(j) * dp, dp);
                  ToFloat(dtype, v16.data() + at, s.v.data() + static_cast<int64_t>(j) * dp, dp);
                }
                s.k_rows[j] = k16.data() + at;
                s.v_rows[j] = v16.data() + at;
              }
              for (int j = n; j < internal::kKeyChunk; ++j) {
                s.k_rows[j] = s.v_rows[j] = s.zero_row.data();
              }
              if (widened) internal::PointAtGatheredRows(s, dp);
              const internal::KvRows type =
                  !widened
                      ? (dtype == DType::kBF16 ? internal::KvRows::kBf16 : internal::KvRows::kF16)
                      : internal::KvRows::kF32;
              internal::AttendChunk(s, type, rows, dp, /*c0=*/0, n);
              std::vector<float> out = s.o;
              out.insert(out.end(), s.sum.begin(), s.sum.begin() + rows);
              return out;
            };
            const std::vector<float> widened = run(true);
            const std::vector<float> in_place = run(false);
            EXPECT_TRUE(widened == in_place);
            EXPECT_GT(*std::max_element(widened.begin(), widened.end()), 0.0f);
          }
        }
      }
    }
  }
  internal::UseAvx512Attention(had_avx512);
}

// The bf16 tiles (AttentionMath::kBf16Tiles) against the double-precision reference: bf16
// caches with blocks whose 16-key groups are and are not consecutive (16, 64: read in place;
// 5, 1: copied), GQA/MQA/MHA and 1B's 32/8, head dims 64 and 128, mixed-precision pools
// (chunks holding int8 blocks run the f32 loops), evicted blocks, and outputs that differ from
// the f32 loops' (the tiles ran); an fp16 cache and head_dim 32 run the f32 loops throughout.
TEST(PagedAttentionTilesTest, MatchesReference) {
  if (!internal::AttentionTilesAvailable(64)) GTEST_SKIP() << "no AMX tiles on this CPU";
  ThreadPool pool(2);
  const std::vector<SeqSpec> specs = {{150, 160}, {0, 37}, {45, 13}, {300, 1}, {63, 1}, {45, 7}};
  for (int block_size : {16, 64, 5, 1}) {
    for (auto [heads, kv_heads] : {std::pair{8, 2}, {4, 1}, {3, 3}, {32, 8}}) {
      for (int head_dim : {64, 128}) {
        kv::KvLayout layout{kLayers, kv_heads, head_dim, block_size, DType::kBF16};
        const auto tiles =
            RunAndCheck(layout, heads, specs, pool, 51, false, false, AttentionMath::kBf16Tiles);
        ASSERT_FALSE(tiles.empty());
        EXPECT_FALSE(tiles == RunAndCheck(layout, heads, specs, pool, 51));
      }
    }
  }
  // Scores up to ~30 that keep rising along the sequence: o and sum are rescaled many times.
  for (int block_size : {16, 5}) {
    kv::KvLayout layout{kLayers, 2, 64, block_size, DType::kBF16};
    ASSERT_FALSE(RunAndCheck(layout, 8, specs, pool, 55, false, false, AttentionMath::kBf16Tiles,
                             /*key_growth=*/0.1f)
                     .empty());
  }
  for (bool evict : {false, true}) {
    kv::KvLayout layout{kLayers, 2, 64, 16, DType::kBF16};
    ASSERT_FALSE(
        RunAndCheck(layout, 8, specs, pool, 52, /*mixed=*/true, evict, AttentionMath::kBf16Tiles)
            .empty());
    ASSERT_FALSE(RunAndCheck(layout, 8, {{200, 30}, {400, 1}}, pool, 53, false, evict,
                             AttentionMath::kBf16Tiles)
                     .empty());
  }
  for (kv::KvLayout f32_loops : {kv::KvLayout{kLayers, 2, 64, 16, DType::kF16},
                                 kv::KvLayout{kLayers, 2, 32, 16, DType::kBF16}}) {
    EXPECT_FALSE(internal::AttentionTilesAvailable(32));
    const auto out =
        RunAndCheck(f32_loops, 8, specs, pool, 54, false, false, AttentionMath::kBf16Tiles);
    EXPECT_TRUE(out == RunAndCheck(f32_loops, 8, specs, pool, 54));
  }
}

// One sequence's outputs do not depend on how its tokens are split into calls (a whole prompt,
// chunked prefill, one token at a time as decode does) nor on the batch it shares a call with
// (other sequences' prefill and decode rows, so its rows take other tiles and lanes), nor on
// the thread count: bit for bit, for both maths. What makes migrated and chunked streams equal
// single-engine greedy.
TEST(PagedAttentionInvarianceTest, SplitsAndBatchesGiveTheSameBits) {
  for (AttentionMath math : {AttentionMath::kF32, AttentionMath::kBf16Tiles}) {
    if (math == AttentionMath::kBf16Tiles && !internal::AttentionTilesAvailable(64)) continue;
    for (int block_size : {16, 5}) {
      for (std::pair<int, int> heads_kv : {std::pair{8, 2}, {3, 3}, {12, 4}}) {
        // (not a structured binding: the lambdas below capture these, which clang 14 refuses)
        const int heads = heads_kv.first, kv_heads = heads_kv.second;
        for (int head_dim : {64, 128}) {
          SCOPED_TRACE(::testing::Message() << (math == AttentionMath::kF32 ? "f32" : "bf16 tiles")
                                            << " block " << block_size << " heads " << heads << "/"
                                            << kv_heads << " head_dim " << head_dim);
          kv::KvLayout layout{kLayers, kv_heads, head_dim, block_size, DType::kBF16};
          std::mt19937 rng(61);
          constexpr int kLen = 150;
          const int64_t width = int64_t{heads} * head_dim;
          // The sequence (blocks 0..) and two neighbours, each in shuffled blocks.
          const std::vector<int> lens = {kLen, 131, 101};
          std::vector<std::vector<int32_t>> tables;
          int total = 0;
          for (int len : lens) total += (len + block_size - 1) / block_size;
          std::vector<int32_t> ids(total);
          std::iota(ids.begin(), ids.end(), 0);
          std::shuffle(ids.begin(), ids.end(), rng);
          std::vector<uint8_t> kv_pool(ids.size() * layout.BlockBytes(), 0xff);
          std::vector<std::vector<float>> qs;
          size_t next = 0;
          for (int len : lens) {
            const int blocks = (len + block_size - 1) / block_size;
            tables.emplace_back(ids.begin() + next, ids.begin() + next + blocks);
            next += blocks;
            // Keys growing along the sequence: the tiles rescale o and sum as scores rise.
            std::vector<float> k = RandomVector(int64_t{len} * kv_heads * head_dim, rng);
            for (size_t i = 0; i < k.size(); ++i) k[i] *= 1.0f + 0.1f * (i / (kv_heads * head_dim));
            const std::vector<float> v = RandomVector(k.size(), rng);
            WriteKv(k.data(), v.data(), len, 0, tables.back().data(), kv_pool.data(), layout,
                    kLayer);
            qs.push_back(RandomVector(len * width, rng));
          }
          const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          // Runs the sequence's tokens [t0, t1) in one call beside the neighbours' `others`.
          std::vector<float> out(kLen * width), neighbours(3 * 32 * width);
          auto call = [&](int t0, int t1, const std::vector<SeqSpec>& others, ThreadPool& pool) {
            std::vector<AttentionSequence> batch;
            for (size_t i = 0; i < others.size(); ++i) {
              const SeqSpec& o = others[i];
              batch.push_back({qs[1 + i % 2].data() + o.start_pos * width,
                               neighbours.data() + i * 32 * width, o.num_tokens, o.start_pos,
                               tables[1 + i % 2].data()});
            }
            // The sequence goes in the middle of the batch.
            batch.insert(batch.begin() + static_cast<int64_t>(batch.size() / 2),
                         {qs[0].data() + t0 * width, out.data() + t0 * width, t1 - t0, t0,
                          tables[0].data()});
            PagedAttention(batch.data(), static_cast<int>(batch.size()), heads, kv_pool.data(),
                           layout, kLayer, scale, pool, math);
          };
          ThreadPool two(2), three(3);
          call(0, kLen, {}, two);
          const std::vector<float> whole = out;
          std::fill(out.begin(), out.end(), 0.0f);
          for (int t0 = 0; t0 < kLen; t0 += 37) {
            call(t0, std::min(kLen, t0 + 37), {{30, 20}, {100, 1}, {0, 7}}, two);
          }
          EXPECT_TRUE(out == whole) << "chunks of 37 beside other rows";
          std::fill(out.begin(), out.end(), 0.0f);
          call(0, 64, {{90, 1}}, three);
          for (int t = 64; t < kLen; ++t) call(t, t + 1, {{t % 90, 1}, {50, 3}}, three);
          EXPECT_TRUE(out == whole) << "64 tokens, then one at a time";
          std::fill(out.begin(), out.end(), 0.0f);
          for (int t0 = 0; t0 < kLen; t0 += 5) call(t0, std::min(kLen, t0 + 5), {{3, 11}}, three);
          EXPECT_TRUE(out == whole) << "chunks of 5";
        }
      }
    }
  }
}

TEST(PagedAttentionLongTest, LongChunkedPrefill) {
  // Many key chunks and query tiles, history longer than one chunk.
  ThreadPool pool(2);
  for (DType dtype : {DType::kF16, DType::kI8}) {
    kv::KvLayout layout{kLayers, 2, 64, 16, dtype};
    RunAndCheck(layout, 8, {{150, 160}, {300, 1}}, pool, 5);
  }
}

TEST(WriteKvTest, PlacesRowsPerLayout) {
  kv::KvLayout layout{kLayers, 3, 8, 4, DType::kF32};
  std::vector<uint8_t> kv_pool(4 * layout.BlockBytes(), 0);
  const std::vector<int32_t> table = {2, 0, 3};
  const int tokens = 6;
  std::vector<float> k(tokens * 3 * 8), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i + 1);
    v[i] = -static_cast<float>(i + 1);
  }
  WriteKv(k.data(), v.data(), tokens, 3, table.data(), kv_pool.data(), layout, kLayer);
  // Element e of head h of the token at position p: written from the spec in kv_layout.h.
  auto at = [&](bool is_v, int64_t p, int h, int e) {
    const int64_t block = table[p / 4];
    const int64_t slot = p % 4;
    const int64_t layer_floats = 2 * 3 * 4 * 8;
    const int64_t index = block * kLayers * layer_floats + kLayer * layer_floats +
                          ((is_v ? 3 : 0) + h) * 4 * 8 + slot * 8 + e;
    return reinterpret_cast<const float*>(kv_pool.data())[index];
  };
  int written = 0;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < 3; ++h) {
      for (int e = 0; e < 8; ++e) {
        ASSERT_EQ(at(false, 3 + t, h, e), k[(t * 3 + h) * 8 + e]);
        ASSERT_EQ(at(true, 3 + t, h, e), v[(t * 3 + h) * 8 + e]);
        written += 2;
      }
    }
  }
  // Nothing else was touched (in particular layer 0 and positions 0..2).
  const auto* all = reinterpret_cast<const float*>(kv_pool.data());
  const int nonzero = static_cast<int>(
      std::count_if(all, all + kv_pool.size() / 4, [](float f) { return f != 0.0f; }));
  EXPECT_EQ(nonzero, written);
}

// An int8 tile: values then one fp16 scale per row, as kv_layout.h specifies.
TEST(WriteKvTest, Int8RowsCarryTheirScaleAfterTheTile) {
  kv::KvLayout layout{1, 1, 4, 2, DType::kI8};
  ASSERT_EQ(layout.HeadBytes(), 2u * (4 + 2));
  ASSERT_EQ(layout.BytesPerToken(), 2u * (4 + 2));
  std::vector<uint8_t> kv_pool(layout.BlockBytes(), 0);
  const int32_t table[] = {0};
  const float k[] = {0.5f, -1.27f, 0.0f, 1.0f, 0, 0, 0, 0};
  const float v[] = {2.54f, 0.0f, -0.02f, 1.0f, 0, 0, 0, 0};
  WriteKv(k, v, 2, 0, table, kv_pool.data(), layout, 0);
  auto q = [&](size_t offset) { return static_cast<int8_t>(kv_pool[offset]); };
  auto scale = [&](size_t offset) {
    uint16_t bits;
    std::memcpy(&bits, kv_pool.data() + offset, 2);
    return F16ToF32(bits);
  };
  // K: rows at 0 and 4, scales at 8 and 10. max |k0| = 1.27 -> scale 0.01 (fp16-rounded).
  EXPECT_NEAR(scale(8), 0.01f, 1e-5f);
  EXPECT_EQ(q(0), 50);
  EXPECT_EQ(q(1), -127);
  EXPECT_EQ(q(2), 0);
  EXPECT_EQ(q(3), 100);
  EXPECT_EQ(scale(10), 0.0f);  // an all-zero row
  EXPECT_EQ(q(4), 0);
  // V starts at HeadBytes(): max |v0| = 2.54 -> scale 0.02.
  EXPECT_NEAR(scale(12 + 8), 0.02f, 2e-5f);
  EXPECT_EQ(q(12 + 0), 127);
  EXPECT_EQ(q(12 + 2), -1);
  EXPECT_EQ(q(12 + 3), 50);
}

}  // namespace
}  // namespace tandem::kernels
