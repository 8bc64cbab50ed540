#include "common/kv/block_pool.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace tandem::kv {
namespace {

KvLayout SmallLayout() {
  return KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 4, .block_size = 4, .dtype = DType::kF32};
}

TEST(BlockPoolTest, ValidatesLayout) {
  EXPECT_TRUE(ValidateKvLayout(SmallLayout()).ok());
  KvLayout l = SmallLayout();
  l.num_layers = 0;
  EXPECT_EQ(ValidateKvLayout(l).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateKvLayout(l).message().find("num_layers"), std::string::npos);
  l = SmallLayout();
  l.head_dim = -3;
  EXPECT_NE(ValidateKvLayout(l).message().find("head_dim"), std::string::npos);
  l = SmallLayout();
  l.block_size = kMaxBlockSize + 1;
  EXPECT_NE(ValidateKvLayout(l).message().find("block_size"), std::string::npos);
  l = SmallLayout();
  l.num_layers = kMaxLayers;
  l.num_kv_heads = kMaxKvHeads;
  EXPECT_EQ(ValidateKvLayout(l).code(), absl::StatusCode::kInvalidArgument);  // block too big
}

TEST(BlockPoolTest, MemoryIsAlignedAndZero) {
  auto pool = BlockPool::Create(SmallLayout(), 8);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->base()) % 64, 0u);
  EXPECT_EQ((*pool)->BlockBytes(0), 512u);
  for (size_t i = 0; i < 8 * 512; ++i) ASSERT_EQ((*pool)->base()[i], 0);
  EXPECT_EQ((*pool)->BlockData(3), (*pool)->base() + 3 * 512);
}

TEST(BlockPoolTest, FreeListThenLruEviction) {
  auto pool_or = BlockPool::Create(SmallLayout(), 3);
  ASSERT_TRUE(pool_or.ok());
  BlockPool& pool = **pool_or;
  bool evicted = true;
  BlockHash h = 0;
  EXPECT_EQ(pool.Allocate(&evicted, &h), 0);
  EXPECT_FALSE(evicted);
  EXPECT_EQ(pool.Allocate(&evicted, &h), 1);
  EXPECT_EQ(pool.Allocate(&evicted, &h), 2);
  EXPECT_EQ(pool.Allocate(&evicted, &h), kNoBlock);
  EXPECT_EQ(pool.num_used(), 3);
  pool.SetIndexed(1, 111);
  pool.SetIndexed(2, 222);
  pool.Release(2);  // cached, oldest
  pool.Release(1);  // cached
  pool.Release(0);  // not indexed: free
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_cached(), 2);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.Allocate(&evicted, &h), 0);  // free list first
  EXPECT_FALSE(evicted);
  EXPECT_EQ(pool.Allocate(&evicted, &h), 2);  // then the oldest cached block
  EXPECT_TRUE(evicted);
  EXPECT_EQ(h, 222u);
  EXPECT_FALSE(pool.block(2).indexed);
  pool.Acquire(1);  // a prefix hit revives the cached block
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_used(), 3);
  EXPECT_EQ(pool.block(1).ref_count, 1);
  EXPECT_EQ(pool.Allocate(&evicted, &h), kNoBlock);
}

}  // namespace
}  // namespace tandem::kv

namespace tandem::kv {
namespace {

// A refcount that would go below zero stops the process in every build (it used to be an
// assert, compiled out of Release, after which the block sat on the free list twice).
TEST(BlockPoolDeathTest, ReleasingABlockNobodyHoldsAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pool = BlockPool::Create(SmallLayout(), 2);
  ASSERT_TRUE(pool.ok());
  bool evicted = false;
  BlockHash hash = 0;
  const int32_t id = (*pool)->Allocate(&evicted, &hash);
  (*pool)->Release(id);
  EXPECT_DEATH((*pool)->Release(id), "releasing a block nobody holds");
}

}  // namespace
}  // namespace tandem::kv
