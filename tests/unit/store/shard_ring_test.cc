#include "common/store/shard_ring.h"

#include <gtest/gtest.h>

#include <vector>

namespace tandem::store {
namespace {

TEST(ShardRingTest, SpreadsKeysEvenly) {
  ShardRing ring({"a:1", "b:1", "c:1", "d:1"});
  std::vector<int> count(4);
  const int n = 100000;
  for (uint64_t k = 0; k < n; ++k) ++count[ring.ShardFor(k)];
  for (int c : count) {
    EXPECT_GT(c, n / 4 * 0.8);
    EXPECT_LT(c, n / 4 * 1.2);
  }
}

TEST(ShardRingTest, RemovingAShardMovesOnlyItsKeys) {
  ShardRing four({"a", "b", "c", "d"});
  ShardRing three({"a", "b", "d"});
  int moved = 0;
  for (uint64_t k = 0; k < 50000; ++k) {
    const std::string before = four.shards()[four.ShardFor(k)];
    const std::string after = three.shards()[three.ShardFor(k)];
    if (before != "c") {
      EXPECT_EQ(before, after) << k;
    } else {
      ++moved;
    }
  }
  EXPECT_GT(moved, 50000 / 4 * 0.8);
  EXPECT_LT(moved, 50000 / 4 * 1.2);
}

TEST(ShardRingTest, PlacementDoesNotDependOnOrder) {
  ShardRing x({"a", "b", "c"});
  ShardRing y({"c", "a", "b"});
  for (uint64_t k = 0; k < 1000; ++k) {
    EXPECT_EQ(x.shards()[x.ShardFor(k)], y.shards()[y.ShardFor(k)]);
  }
}

TEST(ShardRingTest, SingleShardOwnsEverything) {
  ShardRing one({"only"});
  for (uint64_t k : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) EXPECT_EQ(one.ShardFor(k), 0);
}

}  // namespace
}  // namespace tandem::store
