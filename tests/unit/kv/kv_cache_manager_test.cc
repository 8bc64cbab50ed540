#include "common/kv/kv_cache_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "tests/unit/testing/kv_helpers.h"

namespace tandem::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kBs = 4;

KvCacheOptions Options(int64_t num_blocks, bool prefix_caching = true) {
  KvCacheOptions o;
  o.layout = KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 4, .block_size = kBs, .dtype = DType::kF32};
  o.num_blocks = num_blocks;
  o.model_id = "test-model";
  o.enable_prefix_caching = prefix_caching;
  return o;
}

std::unique_ptr<KvCacheManager> Make(int64_t num_blocks, bool prefix_caching = true) {
  return testing::MakeKvCache(Options(num_blocks, prefix_caching));
}

// Tokens start, start+1, ..., start+n-1.
std::vector<int32_t> Seq(int32_t start, int n) { return testing::Iota(n, start); }

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Registers, reserves and commits a whole prompt, as the engine does after prefill.
int Prefill(KvCacheManager& m, int64_t id, const std::vector<int32_t>& prompt) {
  auto cached = m.AddSequence(id, prompt);
  EXPECT_TRUE(cached.ok()) << cached.status();
  EXPECT_TRUE(m.Reserve(id, static_cast<int>(prompt.size())).ok());
  m.CommitTokens(id, prompt, static_cast<int>(prompt.size()));
  return cached.value_or(-1);
}

void ExpectCounts(const KvCacheManager& m, int64_t free, int64_t used, int64_t cached) {
  const KvCacheStats s = m.Stats();
  EXPECT_EQ(s.free_blocks, free);
  EXPECT_EQ(s.used_blocks, used);
  EXPECT_EQ(s.cached_blocks, cached);
  EXPECT_EQ(s.free_blocks + s.used_blocks + s.cached_blocks, s.total_blocks);
}

bool SameStats(const KvCacheStats& a, const KvCacheStats& b) {
  return a.total_blocks == b.total_blocks && a.free_blocks == b.free_blocks &&
         a.used_blocks == b.used_blocks && a.cached_blocks == b.cached_blocks && a.hits == b.hits &&
         a.misses == b.misses && a.evictions == b.evictions && a.num_sequences == b.num_sequences;
}

TEST(KvCacheManagerTest, CreateValidates) {
  auto bad = Options(8);
  bad.layout.num_layers = 0;
  EXPECT_EQ(KvCacheManager::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Options(8);
  bad.layout.head_dim = -1;
  EXPECT_EQ(KvCacheManager::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create(Options(0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCacheManager::Create(Options(int64_t{1} << 40)).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = Options(1 << 30);        // 2^30 blocks...
  bad.layout.num_layers = 4096;  // ...of 1 MiB each: 1 PiB, absurd
  EXPECT_EQ(KvCacheManager::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);

  auto m = Make(8);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->pool_base()) % 64, 0u);
  EXPECT_EQ(m->layout().BlockBytes(), 512u);
  const KvCacheStats s = m->Stats();
  EXPECT_EQ(s.total_blocks, 8);
  ExpectCounts(*m, 8, 0, 0);
  EXPECT_EQ(m->NumAvailableBlocks(), 8);
}

TEST(KvCacheManagerTest, RefcountsAndStatsThroughAllocAndFree) {
  auto m = Make(8);
  const auto prompt = Seq(0, 10);
  ASSERT_EQ(m->AddSequence(1, prompt).value(), 0);
  EXPECT_EQ(m->AddSequence(1, prompt).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(m->Reserve(1, 10).ok());
  EXPECT_THAT(m->BlockTable(1), ElementsAre(0, 1, 2));
  for (int b : {0, 1, 2}) EXPECT_EQ(m->BlockRefCount(b), 1);
  EXPECT_EQ(m->BlockRefCount(3), 0);
  ExpectCounts(*m, 5, 3, 0);
  ASSERT_TRUE(m->Reserve(1, 12).ok());  // still 3 blocks
  EXPECT_EQ(m->NumBlocks(1), 3);
  ASSERT_TRUE(m->Reserve(1, 13).ok());
  EXPECT_EQ(m->NumBlocks(1), 4);
  EXPECT_EQ(m->BlockTableData(1)[3], 3);
  EXPECT_EQ(m->Stats().num_sequences, 1);
  EXPECT_EQ(m->Reserve(2, 4).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m->Reserve(1, -1).code(), absl::StatusCode::kInvalidArgument);
  m->FreeSequence(1);  // nothing committed: every block goes back to free
  ExpectCounts(*m, 8, 0, 0);
  for (int b = 0; b < 8; ++b) EXPECT_EQ(m->BlockRefCount(b), 0);
  m->FreeSequence(1);  // unknown now: ignored
  m->FreeSequence(42);
  EXPECT_TRUE(m->BlockTable(1).empty());
  EXPECT_EQ(m->BlockTableData(1), nullptr);
  EXPECT_EQ(m->Stats().num_sequences, 0);
}

TEST(KvCacheManagerTest, SharedPrefixSharesBlocksWithExactHitCounts) {
  auto m = Make(16);
  const auto prefix = Seq(100, 8);
  EXPECT_EQ(Prefill(*m, 1, Concat(prefix, {7, 7})), 0);
  EXPECT_EQ(m->Stats().misses, 1);  // first lookup missed, no further counting
  EXPECT_EQ(m->Stats().hits, 0);

  EXPECT_EQ(Prefill(*m, 2, Concat(prefix, {9, 9, 9, 9})), 8);
  const auto t1 = m->BlockTable(1);
  const auto t2 = m->BlockTable(2);
  ASSERT_EQ(t2.size(), 3u);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_NE(t2[2], t1[2]);
  EXPECT_EQ(m->BlockRefCount(t1[0]), 2);
  EXPECT_EQ(m->BlockRefCount(t1[1]), 2);
  EXPECT_EQ(m->Stats().hits, 2);
  EXPECT_EQ(m->Stats().misses, 1);
  ExpectCounts(*m, 16 - 4, 4, 0);

  // Same first block, different second block: one hit, then one miss.
  auto other = Concat(Seq(100, 4), Seq(500, 6));
  EXPECT_EQ(m->AddSequence(3, other).value(), 4);
  EXPECT_EQ(m->Stats().hits, 3);
  EXPECT_EQ(m->Stats().misses, 2);
  EXPECT_EQ(m->BlockRefCount(t1[0]), 3);
}

// An admission that cannot reserve is cancelled and retried later: the retry must count its
// lookups once, and the cancelled attempt must leave blocks and stats as they were.
TEST(KvCacheManagerTest, CancelledAdmissionCountsNothing) {
  auto m = Make(4);
  const auto prompt = Concat(Seq(100, 8), {7, 7});
  Prefill(*m, 1, prompt);
  m->FreeSequence(1);  // 3 blocks cached (2 full, indexed), pool has 4
  const KvCacheStats before = m->Stats();

  auto longer = Concat(Seq(100, 8), Seq(900, 12));  // 2 hits, then needs 3 new blocks
  EXPECT_EQ(m->AddSequence(2, longer).value(), 8);
  EXPECT_EQ(m->Stats().hits, before.hits + 2);
  EXPECT_FALSE(m->Reserve(2, static_cast<int>(longer.size())).ok());
  m->CancelSequence(2);
  EXPECT_TRUE(SameStats(m->Stats(), before));

  EXPECT_EQ(m->AddSequence(2, longer).value(), 8);  // the retry counts exactly once
  EXPECT_EQ(m->Stats().hits, before.hits + 2);
  EXPECT_EQ(m->Stats().misses, before.misses + 1);
  m->CancelSequence(99);  // unknown: ignored
}

// A finished prompt's blocks stay findable by hash for export, without touching the stats.
TEST(KvCacheManagerTest, FindCachedPrefixLooksUpWithoutSideEffects) {
  auto m = Make(8);
  const auto prompt = Concat(Seq(100, 12), {5});  // 3 full blocks and a partial one
  Prefill(*m, 1, prompt);
  const auto table = m->BlockTable(1);
  m->FreeSequence(1);
  const KvCacheStats before = m->Stats();
  const auto hashes = HashPrefixBlocks(m->model_hash(), prompt, kBs);
  ASSERT_EQ(hashes.size(), 3u);
  EXPECT_THAT(m->FindCachedPrefix(hashes), ElementsAre(table[0], table[1], table[2]));
  auto other = hashes;
  other[1] ^= 1;  // the chain breaks at the second block
  EXPECT_THAT(m->FindCachedPrefix(other), ElementsAre(table[0]));
  EXPECT_TRUE(m->FindCachedPrefix({}).empty());
  EXPECT_TRUE(SameStats(m->Stats(), before));
}

TEST(KvCacheManagerTest, NeverMapsTheWholePrompt) {
  auto m = Make(16);
  const auto prompt = Seq(0, 8);  // exactly two blocks
  Prefill(*m, 1, prompt);
  const KvCacheStats before = m->Stats();
  EXPECT_EQ(m->AddSequence(2, prompt).value(), 4);  // only (8-1)/4 = 1 block may be mapped
  EXPECT_EQ(m->Stats().hits, before.hits + 1);
  EXPECT_EQ(m->Stats().misses, before.misses);  // the second block was never looked up
  EXPECT_EQ(m->AddSequence(3, Concat(prompt, {1})).value(), 8);
  EXPECT_EQ(m->Stats().hits, before.hits + 3);
  EXPECT_EQ(m->AddSequence(4, Seq(0, 4)).value(), 0);  // one block: nothing may be mapped
  EXPECT_EQ(m->AddSequence(5, {}).value(), 0);
  EXPECT_EQ(m->Stats().hits, before.hits + 3);
  EXPECT_EQ(m->Stats().misses, before.misses);
  EXPECT_EQ(m->NumBlocks(4), 0);
}

TEST(KvCacheManagerTest, LruEvictsOldestReleasedFirst) {
  auto m = Make(4);
  const auto a = Seq(10, 4), b = Seq(20, 4), c = Seq(30, 4);
  Prefill(*m, 1, a);
  Prefill(*m, 2, b);
  Prefill(*m, 3, c);
  const int32_t block_a = m->BlockTable(1)[0];
  const int32_t block_b = m->BlockTable(2)[0];
  const int32_t block_c = m->BlockTable(3)[0];
  const uint64_t mh = m->model_hash();
  m->FreeSequence(1);  // release order: a, c, b
  m->FreeSequence(3);
  m->FreeSequence(2);
  ExpectCounts(*m, 1, 0, 3);

  // Two blocks: the free one, then the least recently released (a).
  ASSERT_TRUE(m->AddSequence(4, Seq(90, 8)).ok());
  ASSERT_TRUE(m->Reserve(4, 8).ok());
  EXPECT_EQ(m->Stats().evictions, 1);
  EXPECT_THAT(m->BlockTable(4), ElementsAre(3, block_a));
  EXPECT_FALSE(m->ContainsHash(HashBlock(mh, 0, a)));
  EXPECT_TRUE(m->ContainsHash(HashBlock(mh, 0, b)));
  EXPECT_TRUE(m->ContainsHash(HashBlock(mh, 0, c)));

  const int64_t misses = m->Stats().misses;
  EXPECT_EQ(m->AddSequence(5, Concat(a, {1})).value(), 0);  // evicted: no longer hits
  EXPECT_EQ(m->Stats().misses, misses + 1);
  EXPECT_EQ(m->AddSequence(6, Concat(c, {1})).value(), 4);  // c revived: now in use
  EXPECT_THAT(m->BlockTable(6), ElementsAre(block_c));
  ExpectCounts(*m, 0, 3, 1);

  // Only b is evictable now.
  ASSERT_TRUE(m->Reserve(5, 4).ok());
  EXPECT_THAT(m->BlockTable(5), ElementsAre(block_b));
  EXPECT_EQ(m->Stats().evictions, 2);
  EXPECT_FALSE(m->ContainsHash(HashBlock(mh, 0, b)));
  EXPECT_TRUE(m->ContainsHash(HashBlock(mh, 0, c)));
}

TEST(KvCacheManagerTest, WithinASequenceTheTailIsEvictedFirst) {
  auto m = Make(3);
  const auto p = Seq(0, 8);
  Prefill(*m, 1, p);
  const auto hashes = HashPrefixBlocks(m->model_hash(), p, kBs);
  m->FreeSequence(1);
  ASSERT_TRUE(m->AddSequence(2, Seq(50, 8)).ok());
  ASSERT_TRUE(m->Reserve(2, 8).ok());  // the free block plus one eviction
  EXPECT_TRUE(m->ContainsHash(hashes[0]));
  EXPECT_FALSE(m->ContainsHash(hashes[1]));
}

TEST(KvCacheManagerTest, OutOfBlocksChangesNothing) {
  auto m = Make(4);
  Prefill(*m, 1, Seq(0, 4));
  m->FreeSequence(1);  // one cached block
  ASSERT_TRUE(m->AddSequence(2, Seq(100, 8)).ok());
  ASSERT_TRUE(m->Reserve(2, 8).ok());
  EXPECT_EQ(m->NumAvailableBlocks(), 2);  // 1 free + 1 evictable
  EXPECT_TRUE(m->CanAllocate(2));
  EXPECT_FALSE(m->CanAllocate(3));

  const KvCacheStats before = m->Stats();
  const auto table = m->BlockTable(2);
  absl::Status s = m->Reserve(2, 8 + 3 * kBs);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("needs 3 more block(s)"));
  EXPECT_THAT(s.message(), HasSubstr("only 2 are available"));
  EXPECT_TRUE(SameStats(before, m->Stats()));
  EXPECT_EQ(m->BlockTable(2), table);
  EXPECT_TRUE(m->ContainsHash(HashBlock(m->model_hash(), 0, Seq(0, 4))));  // not evicted
  EXPECT_TRUE(m->Reserve(2, 8 + 2 * kBs).ok());  // exactly what is available still works
  ExpectCounts(*m, 0, 4, 0);
}

TEST(KvCacheManagerTest, CommitIndexesOnlyFullBlocks) {
  auto m = Make(8);
  std::vector<int32_t> tokens = Seq(0, 6);
  const uint64_t mh = m->model_hash();
  ASSERT_TRUE(m->AddSequence(1, tokens).ok());
  ASSERT_TRUE(m->Reserve(1, 6).ok());
  m->CommitTokens(1, tokens, 3);  // no full block yet
  EXPECT_FALSE(m->ContainsHash(HashPrefixBlocks(mh, Seq(0, 4), kBs)[0]));
  m->CommitTokens(1, tokens, 6);
  auto h = HashPrefixBlocks(mh, Seq(0, 8), kBs);
  EXPECT_TRUE(m->ContainsHash(h[0]));
  EXPECT_FALSE(m->ContainsHash(h[1]));
  tokens.push_back(6);
  tokens.push_back(7);
  m->CommitTokens(1, tokens, 100);  // clamped to the 8 tokens known
  EXPECT_TRUE(m->ContainsHash(h[1]));
  m->CommitTokens(1, tokens, 4);  // going back changes nothing
  EXPECT_TRUE(m->ContainsHash(h[1]));
  m->CommitTokens(77, tokens, 8);  // unknown: ignored
  // A block the table does not cover is not indexed even if tokens are known.
  tokens = Concat(tokens, Seq(8, 4));
  m->CommitTokens(1, tokens, 12);
  EXPECT_FALSE(m->ContainsHash(HashPrefixBlocks(mh, tokens, kBs)[2]));
  m->FreeSequence(1);
  ExpectCounts(*m, 6, 0, 2);
}

TEST(KvCacheManagerTest, DuplicateHashesKeepTheFirstEntry) {
  auto m = Make(8);
  const auto prompt = Seq(0, 9);
  ASSERT_EQ(m->AddSequence(1, prompt).value(), 0);
  ASSERT_EQ(m->AddSequence(2, prompt).value(), 0);  // computed twice concurrently
  ASSERT_TRUE(m->Reserve(1, 9).ok());
  ASSERT_TRUE(m->Reserve(2, 9).ok());
  m->CommitTokens(1, prompt, 9);
  m->CommitTokens(2, prompt, 9);
  const auto t1 = m->BlockTable(1);
  m->FreeSequence(2);  // its duplicates were never indexed: all three go back to free
  ExpectCounts(*m, 5, 3, 0);
  m->FreeSequence(1);
  ExpectCounts(*m, 6, 0, 2);
  ASSERT_EQ(m->AddSequence(3, prompt).value(), 8);
  EXPECT_EQ(m->BlockTable(3)[0], t1[0]);
  EXPECT_EQ(m->BlockTable(3)[1], t1[1]);
  EXPECT_EQ(m->Stats().misses, 2);
  EXPECT_EQ(m->Stats().hits, 2);
}

TEST(KvCacheManagerTest, FreeingEverythingRestoresBaseline) {
  auto m = Make(32);
  const auto prefix = Seq(0, 8);
  for (int i = 0; i < 5; ++i) {
    auto p = Concat(prefix, Seq(1000 * (i + 1), 3 + i));
    Prefill(*m, i, p);
    p.push_back(5);  // one decode step
    ASSERT_TRUE(m->Reserve(i, static_cast<int>(p.size())).ok());
    m->CommitTokens(i, p, static_cast<int>(p.size()));
  }
  for (int i = 4; i >= 0; --i) m->FreeSequence(i);
  KvCacheStats s = m->Stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.num_sequences, 0);
  EXPECT_EQ(s.free_blocks + s.cached_blocks, 32);
  EXPECT_GT(s.cached_blocks, 0);
  m->ResetPrefixCache();
  ExpectCounts(*m, 32, 0, 0);
  EXPECT_FALSE(m->ContainsHash(HashPrefixBlocks(m->model_hash(), prefix, kBs)[0]));
  EXPECT_EQ(m->AddSequence(9, Concat(prefix, {1})).value(), 0);
}

TEST(KvCacheManagerTest, ResetKeepsBlocksInUse) {
  auto m = Make(8);
  const auto p = Seq(0, 8);
  Prefill(*m, 1, p);
  Prefill(*m, 2, Seq(50, 4));
  m->FreeSequence(2);
  m->ResetPrefixCache();
  ExpectCounts(*m, 6, 2, 0);
  EXPECT_TRUE(m->ContainsHash(HashPrefixBlocks(m->model_hash(), p, kBs)[0]));
  m->FreeSequence(1);
  ExpectCounts(*m, 6, 0, 2);
}

TEST(KvCacheManagerTest, PrefixCachingDisabled) {
  auto m = Make(8, /*prefix_caching=*/false);
  const auto p = Seq(0, 9);
  EXPECT_EQ(Prefill(*m, 1, p), 0);
  m->FreeSequence(1);
  EXPECT_EQ(Prefill(*m, 2, p), 0);
  EXPECT_EQ(m->Stats().hits, 0);
  EXPECT_EQ(m->Stats().misses, 0);
  m->FreeSequence(2);
  ExpectCounts(*m, 8, 0, 0);
}

TEST(KvCacheManagerTest, BlockTableDataMatchesCopy) {
  auto m = Make(8);
  ASSERT_TRUE(m->AddSequence(1, Seq(0, 5)).ok());
  ASSERT_TRUE(m->Reserve(1, 5).ok());
  const auto t = m->BlockTable(1);
  const int32_t* data = m->BlockTableData(1);
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(std::vector<int32_t>(data, data + t.size()), t);
  ASSERT_TRUE(m->Reserve(1, 5).ok());  // no growth: pointer stays valid
  EXPECT_EQ(m->BlockTableData(1), data);
}

TEST(KvCacheManagerTest, EvictedBlocksLeaveHolesAndStayOutOfTheIndex) {
  auto m = Make(16);
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = 100 + i;
  ASSERT_TRUE(m->AddSequence(1, tokens).ok());
  ASSERT_TRUE(m->Reserve(1, 24).ok());
  m->CommitTokens(1, tokens, 24);  // blocks 0..5 (4 tokens each), indexed as they fill
  const int indexed_before = static_cast<int>(m->IndexedHashes().size());
  const std::vector<int32_t> before = m->BlockTable(1);
  EXPECT_EQ(m->EvictBlocks(1, 1, 3), 2);
  EXPECT_EQ(m->EvictBlocks(1, 1, 3), 0);    // already gone
  EXPECT_EQ(m->EvictBlocks(1, 5, 100), 1);  // clamped to the table
  const std::vector<int32_t> after = m->BlockTable(1);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[1], kNoBlock);
  EXPECT_EQ(after[2], kNoBlock);
  EXPECT_EQ(m->Stats().window_evicted, 3);
  // Indexed blocks that were evicted stay reusable as cache; new blocks are not indexed.
  ASSERT_TRUE(m->Reserve(1, 40).ok());
  m->CommitTokens(1, tokens, 40);
  EXPECT_EQ(static_cast<int>(m->IndexedHashes().size()), indexed_before);
  m->FreeSequence(1);
  const KvCacheStats s = m->Stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.free_blocks + s.cached_blocks, s.total_blocks);
}

}  // namespace
}  // namespace tandem::kv
