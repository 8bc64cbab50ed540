// The mixed-precision KV cache (kv_cache.dtype mixed): a pool of fp16 and int8 blocks, the
// manager requantizing blocks that fall behind the window, and their transfer between caches.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/kv/block_pool.h"
#include "common/kv/kv_cache_manager.h"
#include "common/kv/kv_rows.h"
#include "common/kv/kv_transfer.h"
#include "tests/unit/testing/kv_helpers.h"

namespace tandem::kv {
namespace {

using ::testing::HasSubstr;

constexpr int kBs = 4;

KvLayout Fp16Layout() {
  return KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = kBs, .dtype = DType::kF16};
}

KvCacheOptions MixedOptions(int64_t wide, int64_t narrow, int sink = 4, int window = 8) {
  KvCacheOptions o;
  o.layout = Fp16Layout();
  o.num_blocks = wide;
  o.mixed = {.narrow_blocks = narrow, .sink_tokens = sink, .window_tokens = window};
  o.model_id = "model-a";
  return o;
}

std::unique_ptr<KvCacheManager> Make(const KvCacheOptions& o) { return testing::MakeKvCache(o); }

std::vector<int32_t> Prompt(int n) { return testing::Iota(n, 40); }

// A deterministic value for element i of a row (layer, head, K/V, position): distinct per row so
// a row landing in the wrong place is caught.
std::vector<float> RowValues(int layer, int head, bool value, int64_t pos, int d) {
  std::vector<float> row(d);
  for (int i = 0; i < d; ++i) {
    row[i] = std::sin(0.37f * i + 1.3f * layer + 0.7f * head + (value ? 2.1f : 0.0f) +
                      0.011f * static_cast<float>(pos)) *
             (1.0f + 0.1f * static_cast<float>(pos % 7));
  }
  return row;
}

// Calls fn(block id, row, expected values) for every K and V row of positions [begin, end) of
// sequence `seq`.
template <typename Fn>
void ForEachRow(KvCacheManager& m, int64_t seq, int64_t begin, int64_t end, Fn&& fn) {
  const std::vector<int32_t> table = m.BlockTable(seq);
  const KvLayout& l = m.arena().layout;
  for (int64_t pos = begin; pos < end; ++pos) {
    for (int layer = 0; layer < l.num_layers; ++layer) {
      for (int head = 0; head < l.num_kv_heads; ++head) {
        for (bool value : {false, true}) {
          fn(table[pos / kBs], KvRowRef{layer, head, value, static_cast<int>(pos % kBs)},
             RowValues(layer, head, value, pos, l.head_dim));
        }
      }
    }
  }
}

// Writes every row of positions [begin, end) of sequence `seq` through the arena.
void WriteRows(KvCacheManager& m, int64_t seq, int64_t begin, int64_t end) {
  const KvArena& arena = m.arena();
  ForEachRow(m, seq, begin, end, [&](int32_t id, const KvRowRef& ref, std::vector<float> row) {
    WriteKvRow(arena.Block(id), arena.LayoutOf(id), ref, row.data());
  });
}

// Largest |read - written| over every row of positions [0, n) of `seq`, relative to the row's
// max |x|, separately for rows in fp16 and in int8 blocks.
struct RowErrors {
  double wide = 0;
  double narrow = 0;
};
RowErrors ReadBackErrors(KvCacheManager& m, int64_t seq, int64_t n) {
  const KvArena& arena = m.arena();
  RowErrors e;
  std::vector<float> got(arena.layout.head_dim);
  ForEachRow(m, seq, 0, n, [&](int32_t id, const KvRowRef& ref, std::vector<float> want) {
    ReadKvRow(arena.Block(id), arena.LayoutOf(id), ref, got.data());
    double max_abs = 0, err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(double{want[i]}));
      err = std::max(err, std::fabs(double{got[i]} - want[i]));
    }
    double& slot = arena.IsNarrow(id) ? e.narrow : e.wide;
    slot = std::max(slot, err / max_abs);
  });
  return e;
}

// Registers `prompt` as sequence 1, writes its rows and commits them (requantizing what falls
// behind the window).
void PrefillWithRows(KvCacheManager& m, const std::vector<int32_t>& prompt) {
  const int n = static_cast<int>(prompt.size());
  ASSERT_TRUE(m.AddSequence(1, prompt).ok());
  ASSERT_TRUE(m.Reserve(1, n).ok());
  WriteRows(m, 1, 0, n);
  m.CommitTokens(1, prompt, n);
}

// Kinds of a sequence's blocks, 'w' or 'n' each.
std::string Kinds(const KvCacheManager& m, int64_t seq) {
  std::string s;
  for (int32_t id : m.BlockTable(seq)) s += m.arena().IsNarrow(id) ? 'n' : 'w';
  return s;
}

TEST(MixedBlockPoolTest, BlocksOfBothKindsLiveOneAfterTheOther) {
  auto pool_or = BlockPool::Create(Fp16Layout(), 2, 3);
  ASSERT_TRUE(pool_or.ok()) << pool_or.status();
  BlockPool& pool = **pool_or;
  // layers x K,V x heads x tokens x (head_dim x 2 bytes), or x (head_dim + 2-byte scale)
  const size_t wide = Fp16Layout().BlockBytes();
  KvLayout narrow = Fp16Layout();
  narrow.dtype = DType::kI8;
  EXPECT_EQ(wide, 2u * 2 * 2 * 4 * 8 * 2);
  EXPECT_EQ(narrow.BlockBytes(), 2u * 2 * 2 * 4 * (8 + 2));
  EXPECT_EQ(pool.num_blocks(), 5);
  EXPECT_EQ(pool.num_wide(), 2);
  EXPECT_EQ(pool.num_narrow(), 3);
  EXPECT_EQ(pool.BlockData(1), pool.base() + wide);
  EXPECT_EQ(pool.BlockData(2), pool.base() + 2 * wide);
  EXPECT_EQ(pool.BlockData(4), pool.base() + 2 * wide + 2 * narrow.BlockBytes());
  EXPECT_EQ(pool.BlockBytes(4), narrow.BlockBytes());
  EXPECT_EQ(pool.KindOf(1), BlockKind::kWide);
  EXPECT_EQ(pool.KindOf(2), BlockKind::kNarrow);
}

TEST(MixedBlockPoolTest, EachKindFirstThenItsCachedBlocksThenTheOtherKind) {
  auto pool_or = BlockPool::Create(Fp16Layout(), 2, 2);
  ASSERT_TRUE(pool_or.ok());
  BlockPool& pool = **pool_or;
  bool evicted = false;
  BlockHash h = 0;
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kNarrow), 2);
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kWide), 0);
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kWide), 1);
  pool.SetIndexed(1, 111);
  pool.Release(1);  // a cached wide block
  // A wide block: the cached one is evicted before a free int8 block is taken.
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kWide), 1);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(h, 111u);
  // No wide block left: the free int8 block, unless only a wide one will do.
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kWide, /*only_kind=*/true), kNoBlock);
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kWide), 3);
  EXPECT_FALSE(evicted);
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kNarrow), kNoBlock);
  EXPECT_EQ(pool.num_used(), 4);
  pool.Release(0);
  EXPECT_EQ(pool.num_free(BlockKind::kWide), 1);
  EXPECT_EQ(pool.num_free(BlockKind::kNarrow), 0);
  // An int8 request falls back to the free wide block.
  EXPECT_EQ(pool.Allocate(&evicted, &h, BlockKind::kNarrow), 0);
}

TEST(MixedKvCacheTest, CreateRefusesNegativeWindows) {
  auto m = KvCacheManager::Create(MixedOptions(4, 4, /*sink=*/-1));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("sink_tokens"));
}

TEST(MixedKvCacheTest, BlocksBehindTheWindowBecomeInt8AndKeepTheirValues) {
  auto m = Make(MixedOptions(/*wide=*/16, /*narrow=*/16));  // sink 4 = 1 block, window 8
  const std::vector<int32_t> prompt = Prompt(30);
  ASSERT_TRUE(m->AddSequence(1, prompt).ok());
  ASSERT_TRUE(m->Reserve(1, 30).ok());
  EXPECT_EQ(Kinds(*m, 1), "wwwwwwww");  // new blocks are fp16
  WriteRows(*m, 1, 0, 30);
  m->CommitTokens(1, prompt, 30);
  // Blocks wholly before position 30 - 8 = 22: 0..4; block 0 holds the sink.
  EXPECT_EQ(Kinds(*m, 1), "wnnnnwww");
  EXPECT_EQ(m->Stats().narrowed, 4);
  EXPECT_EQ(m->Stats().narrow_blocks, 16);
  const RowErrors e = ReadBackErrors(*m, 1, 30);
  EXPECT_LT(e.wide, 1e-3);                // fp16: 2^-11 relative
  EXPECT_LT(e.narrow, 0.5 / 127 + 1e-3);  // int8: half a step of max|x| / 127
  EXPECT_GT(e.narrow, e.wide);            // they really are int8
  // The freed fp16 blocks are free again: 16 - 8 + 4, the int8 ones 16 - 4.
  EXPECT_EQ(m->NumAvailableBlocks(), 12 + 12);

  // The prefix index follows the blocks: a new sequence with the same prompt maps the int8 ones.
  const auto hashes = HashPrefixBlocks(m->model_hash(), prompt, kBs);
  const std::vector<int32_t> found = m->FindCachedPrefix(hashes);
  ASSERT_EQ(found.size(), 7u);
  const std::vector<int32_t> table = m->BlockTable(1);
  for (size_t i = 0; i < found.size(); ++i) EXPECT_EQ(found[i], table[i]) << i;

  // Decoding on: each commit narrows what fell behind, once.
  std::vector<int32_t> tokens = prompt;
  for (int t = 30; t < 40; ++t) {
    tokens.push_back(t);
    ASSERT_TRUE(m->Reserve(1, t + 1).ok());
    WriteRows(*m, 1, t, t + 1);
    m->CommitTokens(1, tokens, t + 1);
  }
  EXPECT_EQ(Kinds(*m, 1), "wnnnnnnnww");  // behind 40 - 8 = 32: blocks 1..7
  EXPECT_EQ(m->Stats().narrowed, 7);
  const RowErrors after = ReadBackErrors(*m, 1, 40);
  EXPECT_LT(after.wide, 1e-3);
  EXPECT_LT(after.narrow, 0.5 / 127 + 1e-3);
  m->FreeSequence(1);
  const KvCacheStats s = m->Stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.free_blocks + s.cached_blocks, s.total_blocks);
}

TEST(MixedKvCacheTest, FootprintMatchesWhatTheCacheHolds) {
  for (int64_t n : {1, 7, 12, 13, 30, 33, 64, 101}) {
    auto m = Make(MixedOptions(64, 64, /*sink=*/5, /*window=*/10));
    const std::vector<int32_t> prompt = Prompt(static_cast<int>(n));
    ASSERT_TRUE(m->AddSequence(1, prompt).ok());
    ASSERT_TRUE(m->Reserve(1, static_cast<int>(n)).ok());
    m->CommitTokens(1, prompt, static_cast<int>(n));
    const std::string kinds = Kinds(*m, 1);
    const int64_t narrow_tokens = std::count(kinds.begin(), kinds.end(), 'n') * kBs;
    const MixedKvFootprint f =
        MixedFootprint(Fp16Layout(), {.sink_tokens = 5, .window_tokens = 10}, n);
    EXPECT_EQ(f.narrow_tokens, narrow_tokens) << n << " " << kinds;
    EXPECT_EQ(f.wide_tokens, n - narrow_tokens) << n;
    KvLayout narrow = Fp16Layout();
    narrow.dtype = DType::kI8;
    EXPECT_EQ(f.bytes, (n - narrow_tokens) * Fp16Layout().BytesPerToken() +
                           narrow_tokens * narrow.BytesPerToken());
  }
}

TEST(MixedKvCacheTest, WithoutAnInt8BlockABlockWaitsAndSharedBlocksStayFp16) {
  auto m = Make(MixedOptions(/*wide=*/16, /*narrow=*/2, /*sink=*/0, /*window=*/4));
  std::vector<int32_t> other = Prompt(12);
  for (int32_t& t : other) t += 1000;
  ASSERT_TRUE(m->AddSequence(0, other).ok());
  ASSERT_TRUE(m->Reserve(0, 12).ok());
  m->CommitTokens(0, other, 12);  // behind 12 - 4 = 8: blocks 0, 1 take both int8 blocks
  EXPECT_EQ(Kinds(*m, 0), "nnw");

  const std::vector<int32_t> prompt = Prompt(21);
  ASSERT_TRUE(m->AddSequence(1, prompt).ok());
  ASSERT_TRUE(m->Reserve(1, 21).ok());
  WriteRows(*m, 1, 0, 21);
  m->CommitTokens(1, prompt, 21);
  EXPECT_EQ(Kinds(*m, 1), "wwwwww");  // blocks 0..3 are behind, but no int8 block is free
  EXPECT_EQ(m->Stats().narrowed, 2);

  m->FreeSequence(0);  // its int8 blocks are cached now, so evictable
  m->CommitTokens(1, prompt, 21);
  EXPECT_EQ(Kinds(*m, 1), "nnwwww");
  EXPECT_EQ(m->Stats().narrowed, 4);
  EXPECT_EQ(m->Stats().evictions, 2);
  EXPECT_LT(ReadBackErrors(*m, 1, 21).narrow, 0.5 / 127 + 1e-3);

  // Sequence 2 maps blocks 0..4 of sequence 1: the shared fp16 ones are left alone.
  ASSERT_TRUE(m->AddSequence(2, prompt).ok());
  ASSERT_TRUE(m->Reserve(2, 21).ok());
  m->CommitTokens(2, prompt, 21);
  EXPECT_EQ(Kinds(*m, 2), "nnwwww");
  EXPECT_EQ(m->Stats().narrowed, 4);
}

TEST(MixedKvCacheTest, ASharedBlockBecomesInt8OnceTheOtherSequenceLeaves) {
  auto m = Make(MixedOptions(/*wide=*/16, /*narrow=*/8, /*sink=*/0, /*window=*/8));
  const std::vector<int32_t> prompt = Prompt(12);
  PrefillWithRows(*m, prompt);  // behind 12 - 8 = 4: block 0
  EXPECT_EQ(Kinds(*m, 1), "nww");

  std::vector<int32_t> longer = prompt;
  longer.push_back(7);
  ASSERT_TRUE(m->AddSequence(2, longer).ok());  // maps blocks 0..2 of sequence 1
  EXPECT_EQ(m->BlockTable(2)[1], m->BlockTable(1)[1]);

  std::vector<int32_t> tokens = prompt;
  for (int t = 0; t < 8; ++t) tokens.push_back(100 + t);
  ASSERT_TRUE(m->Reserve(1, 20).ok());
  WriteRows(*m, 1, 12, 20);
  m->CommitTokens(1, tokens, 20);  // blocks 1, 2 are behind now, but sequence 2 shares them
  EXPECT_EQ(Kinds(*m, 1), "nwwww");

  m->FreeSequence(2);
  tokens.push_back(108);
  ASSERT_TRUE(m->Reserve(1, 21).ok());
  WriteRows(*m, 1, 20, 21);
  m->CommitTokens(1, tokens, 21);
  EXPECT_EQ(Kinds(*m, 1), "nnnwww");
  EXPECT_EQ(m->Stats().narrowed, 3);
  EXPECT_LT(ReadBackErrors(*m, 1, 21).narrow, 0.5 / 127 + 1e-3);
}

TEST(MixedKvCacheTest, TransferKeepsEachBlocksDtypeAndRefusesOtherCaches) {
  auto a = Make(MixedOptions(16, 16));
  const std::vector<int32_t> prompt = Prompt(30);
  PrefillWithRows(*a, prompt);
  ASSERT_EQ(Kinds(*a, 1), "wnnnnwww");
  const auto hashes = HashPrefixBlocks(a->model_hash(), prompt, kBs);
  const std::vector<int32_t> table = a->BlockTable(1);

  auto b = Make(MixedOptions(16, 16));
  for (size_t i = 0; i < hashes.size(); ++i) {  // one block per export, as the handoff does
    auto bytes = ExportBlocks(*a, std::span(&table[i], 1), std::span(&hashes[i], 1));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto r = ImportBlocks(*b, *bytes);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->imported, 1);
  }
  const std::vector<int32_t> got = b->FindCachedPrefix(hashes);
  ASSERT_EQ(got.size(), hashes.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(b->arena().IsNarrow(got[i]), a->arena().IsNarrow(table[i])) << i;
    const size_t bytes = a->arena().LayoutOf(table[i]).BlockBytes();
    EXPECT_EQ(std::memcmp(b->arena().Block(got[i]), a->arena().Block(table[i]), bytes), 0) << i;
  }

  // An fp16 cache and a mixed one refuse each other's blocks, naming both dtypes.
  KvCacheOptions plain = MixedOptions(16, 0);
  plain.mixed = {};
  auto fp16 = Make(plain);
  auto narrow_block = ExportBlocks(*a, std::span(&table[1], 1), std::span(&hashes[1], 1));
  auto wide_block = ExportBlocks(*a, std::span(&table[0], 1), std::span(&hashes[0], 1));
  for (const auto* blob : {&narrow_block, &wide_block}) {
    ASSERT_TRUE(blob->ok());
    auto r = ImportBlocks(*fp16, **blob);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(), HasSubstr("data has mixed (fp16 + int8)"));
    EXPECT_THAT(r.status().message(), HasSubstr("this cache has fp16"));
  }
  ASSERT_TRUE(fp16->AddSequence(1, prompt).ok());
  ASSERT_TRUE(fp16->Reserve(1, 30).ok());
  fp16->CommitTokens(1, prompt, 30);
  const int32_t first = fp16->BlockTable(1)[0];
  auto plain_block = ExportBlocks(*fp16, std::span(&first, 1), std::span(&hashes[0], 1));
  ASSERT_TRUE(plain_block.ok());
  auto r = ImportBlocks(*b, *plain_block);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("data has fp16, this cache has mixed (fp16 + int8)"));
}

TEST(MixedKvCacheTest, ImportedInt8BlocksFallBackToFp16BlocksConverted) {
  auto a = Make(MixedOptions(16, 16));
  const std::vector<int32_t> prompt = Prompt(30);
  PrefillWithRows(*a, prompt);
  const auto hashes = HashPrefixBlocks(a->model_hash(), prompt, kBs);
  const std::vector<int32_t> table = a->BlockTable(1);
  ASSERT_TRUE(a->arena().IsNarrow(table[1]));

  auto b = Make(MixedOptions(/*wide=*/4, /*narrow=*/1, /*sink=*/0, /*window=*/4));
  std::vector<int32_t> other = Prompt(8);
  for (int32_t& t : other) t += 1000;
  ASSERT_TRUE(b->AddSequence(9, other).ok());
  ASSERT_TRUE(b->Reserve(9, 8).ok());
  b->CommitTokens(9, other, 8);  // block 0 takes b's only int8 block
  ASSERT_EQ(Kinds(*b, 9), "nw");
  auto bytes = ExportBlocks(*a, std::span(&table[1], 1), std::span(&hashes[1], 1));
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(ImportBlocks(*b, *bytes).ok());
  const std::vector<int32_t> one = b->FindCachedPrefix(std::span(&hashes[1], 1));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(b->arena().IsNarrow(one[0]));
  // Read back through either cache's layout: the same values.
  std::vector<float> x(8), y(8);
  for (int layer = 0; layer < 2; ++layer) {
    for (int slot = 0; slot < kBs; ++slot) {
      const KvRowRef ref{layer, 1, true, slot};
      ReadKvRow(a->arena().Block(table[1]), a->arena().LayoutOf(table[1]), ref, x.data());
      ReadKvRow(b->arena().Block(one[0]), b->arena().LayoutOf(one[0]), ref, y.data());
      for (int i = 0; i < 8; ++i) EXPECT_NEAR(x[i], y[i], 1e-3 * std::fabs(x[i]) + 1e-6);
    }
  }
}

}  // namespace
}  // namespace tandem::kv
