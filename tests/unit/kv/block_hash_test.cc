#include "common/kv/block_hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <vector>

namespace tandem::kv {
namespace {

TEST(BlockHashTest, MatchesDocumentedDefinition) {
  // The definition is a cross-process contract (prefill and decode must agree), so pin it.
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const uint64_t model = HashModelId("llama");
  EXPECT_EQ(model, XXH3_64bits("llama", 5));
  const uint64_t seed_input[2] = {model, 77};
  const uint64_t seed = XXH3_64bits(seed_input, sizeof(seed_input));
  EXPECT_EQ(HashBlock(model, 77, tokens),
            XXH3_64bits_withSeed(tokens.data(), tokens.size() * 4, seed));
}

TEST(BlockHashTest, EqualPrefixesGiveEqualHashes) {
  const uint64_t m = HashModelId("m");
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 100, 101, 102, 103};
  const auto ha = HashPrefixBlocks(m, a, 4);
  const auto hb = HashPrefixBlocks(m, b, 4);
  ASSERT_EQ(ha.size(), 2u);  // the partial third block of `a` is not hashed
  ASSERT_EQ(hb.size(), 3u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[1], hb[1]);
  EXPECT_NE(ha[0], ha[1]);
}

TEST(BlockHashTest, EarlierBlockChangesLaterHashes) {
  const uint64_t m = HashModelId("m");
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> b = {1, 2, 3, 9, 5, 6, 7, 8};  // differs only in block 0
  const auto ha = HashPrefixBlocks(m, a, 4);
  const auto hb = HashPrefixBlocks(m, b, 4);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);  // same tokens in block 1, different chain
  EXPECT_NE(HashBlock(m, 1, std::span(a).first(4)), HashBlock(m, 2, std::span(a).first(4)));
}

TEST(BlockHashTest, DependsOnModelId) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  EXPECT_NE(HashModelId("a"), HashModelId("b"));
  EXPECT_NE(HashBlock(HashModelId("a"), 0, a), HashBlock(HashModelId("b"), 0, a));
}

// Weights replaced under the same model id: another fingerprint, other hashes; none (0) leaves
// the id's hash as it was.
TEST(BlockHashTest, DependsOnTheWeightsFingerprint) {
  EXPECT_EQ(HashModelId("a", "int8", 0), HashModelId("a", "int8"));
  EXPECT_NE(HashModelId("a", "", 7), HashModelId("a", "", 8));
  EXPECT_NE(HashModelId("a", "", 7), HashModelId("a"));
}

TEST(BlockHashTest, HashPrefixBlocksIsTheChain) {
  const uint64_t m = HashModelId("m");
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 10, 11};
  const auto h = HashPrefixBlocks(m, t, 3);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], HashBlock(m, 0, std::span(t).subspan(0, 3)));
  EXPECT_EQ(h[1], HashBlock(m, h[0], std::span(t).subspan(3, 3)));
  EXPECT_TRUE(HashPrefixBlocks(m, t, 0).empty());
  EXPECT_TRUE(HashPrefixBlocks(m, std::span(t).first(2), 3).empty());
}

}  // namespace
}  // namespace tandem::kv
