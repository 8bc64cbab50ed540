#include "common/kv/kv_eviction.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/kv/kv_rows.h"
#include "tests/unit/testing/kv_helpers.h"

namespace tandem::kv {
namespace {

constexpr int kBs = 4;

std::unique_ptr<KvCacheManager> Make() {
  KvCacheOptions o;
  o.layout = KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = kBs, .dtype = DType::kF16};
  o.num_blocks = 64;
  o.model_id = "eviction-test";
  return testing::MakeKvCache(o);
}

std::vector<int32_t> Tokens(int n) { return testing::Iota(n, 5); }

// Writes K rows of layer 1 (the middle layer the policy reads) for positions [0, n): each row is
// `topic(pos)`'s direction plus a little noise.
template <typename Topic>
void WriteKeys(KvCacheManager& m, int n, Topic topic) {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  const std::vector<int32_t> table = m.BlockTable(1);
  std::vector<float> row(8);
  for (int pos = 0; pos < n; ++pos) {
    for (int head = 0; head < 2; ++head) {
      for (int i = 0; i < 8; ++i) row[i] = (topic(pos) == (i < 4) ? 1.0f : 0.0f) + noise(rng);
      const int32_t id = table[pos / kBs];
      WriteKvRow(m.arena().Block(id), m.arena().LayoutOf(id), {1, head, false, pos % kBs},
                 row.data());
    }
  }
}

std::string Live(const KvCacheManager& m) {
  std::string s;
  for (int32_t id : m.BlockTable(1)) s += id == kNoBlock ? '.' : 'x';
  return s;
}

TEST(KvEvictionTest, SlidingKeepsTheSinkBlockAndTheLastBudget) {
  auto m = Make();
  const std::vector<int32_t> t = Tokens(40);
  ASSERT_TRUE(m->AddSequence(1, t).ok());
  SequenceEviction off({.budget_tokens = 0});
  SequenceEviction sliding({.budget_tokens = 16, .sink_tokens = 4});
  for (int n = 1; n <= 40; ++n) {
    ASSERT_TRUE(m->Reserve(1, n).ok());
    m->CommitTokens(1, t, n);
    EXPECT_EQ(off.Apply(*m, 1, n), 0);
    sliding.Apply(*m, 1, n);
    // Never more than the sink block and 3 recent blocks (the one being filled among them).
    const std::string live = Live(*m);
    EXPECT_LE(std::count(live.begin(), live.end(), 'x'), 4) << n << " " << live;
  }
  EXPECT_EQ(Live(*m), "x......xxx");
  EXPECT_EQ(m->Stats().window_evicted, 6);
}

TEST(KvEvictionTest, SemanticCutsWhereTheTopicShifts) {
  auto m = Make();
  const std::vector<int32_t> t = Tokens(96);
  ASSERT_TRUE(m->AddSequence(1, t).ok());
  ASSERT_TRUE(m->Reserve(1, 96).ok());
  // Topic A for positions 0..47, B from 48: chunks of 8 tokens (2 blocks), shift at block 12.
  WriteKeys(*m, 96, [](int pos) { return pos < 48; });
  m->CommitTokens(1, t, 96);
  // Budget 64 tokens: sliding would cut at block 24 - 15 = 9; the shift at 12 is within reach
  // (at least half the budget, 8 blocks, stays).
  SequenceEviction semantic(
      {.budget_tokens = 64, .sink_tokens = 4, .semantic = true, .chunk_tokens = 8});
  EXPECT_EQ(semantic.Apply(*m, 1, 96), 11);
  EXPECT_EQ(semantic.segment_starts(), std::vector<int>{12});
  EXPECT_EQ(Live(*m), "x...........xxxxxxxxxxxx");

  // Without a shift that stands out (noise alone, judged at 4 standard deviations) it is the
  // sliding cut.
  auto flat = Make();
  ASSERT_TRUE(flat->AddSequence(1, t).ok());
  ASSERT_TRUE(flat->Reserve(1, 96).ok());
  WriteKeys(*flat, 96, [](int) { return true; });
  flat->CommitTokens(1, t, 96);
  SequenceEviction no_shift({.budget_tokens = 64,
                             .sink_tokens = 4,
                             .semantic = true,
                             .shift_threshold = 4.0,
                             .chunk_tokens = 8});
  EXPECT_EQ(no_shift.Apply(*flat, 1, 96), 8);
  EXPECT_TRUE(no_shift.segment_starts().empty());
  EXPECT_EQ(Live(*flat), "x........xxxxxxxxxxxxxxx");
}

}  // namespace
}  // namespace tandem::kv
