#include "cache_store/block_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

namespace tandem::cache_store {
namespace {

using ::testing::HasSubstr;

// Deterministic content of block `hash`, so readers can check what they got.
std::vector<uint8_t> Content(uint64_t hash, int64_t size) {
  std::vector<uint8_t> v(size);
  for (int64_t i = 0; i < size; ++i) v[i] = static_cast<uint8_t>((hash * 131 + i * 7) >> 1);
  return v;
}

std::unique_ptr<BlockStore> Make(int64_t capacity, int64_t max_block = 1 << 20) {
  auto s = BlockStore::Create({.capacity_bytes = capacity, .max_block_bytes = max_block});
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

absl::Status Put(BlockStore& store, uint64_t hash, int64_t size) {
  const auto data = Content(hash, size);
  auto put = store.BeginPut(hash, size, BlockChecksum(data));
  if (!put.ok()) return put.status();
  for (int64_t off = 0; off < size; off += 100) {
    const int64_t n = std::min<int64_t>(100, size - off);
    if (auto s = put->Append({data.data() + off, static_cast<size_t>(n)}); !s.ok()) return s;
  }
  return put->Commit();
}

TEST(BlockStoreTest, PutThenGetReturnsTheBytes) {
  auto store = Make(10000);
  ASSERT_TRUE(Put(*store, 7, 1000).ok());
  EXPECT_TRUE(store->Exists(7));
  auto ref = store->Get(7);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(std::vector<uint8_t>(ref->data().begin(), ref->data().end()), Content(7, 1000));
  EXPECT_EQ(ref->checksum(), BlockChecksum(Content(7, 1000)));
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(s.used_bytes, 1000);
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.pinned_blocks, 1);
  ref->Reset();
  EXPECT_EQ(store->Stats().pinned_blocks, 0);
  EXPECT_EQ(store->Get(8).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().misses, 1);
}

TEST(BlockStoreTest, APartialBlockIsNeverVisible) {
  auto store = Make(10000);
  const auto data = Content(1, 1000);
  auto put = store->BeginPut(1, 1000, BlockChecksum(data));
  ASSERT_TRUE(put.ok());
  ASSERT_TRUE(put->Append({data.data(), 500}).ok());
  EXPECT_FALSE(store->Exists(1));
  EXPECT_EQ(store->Get(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Stats().pending_puts, 1);
  EXPECT_EQ(store->Stats().used_bytes, 1000);  // reserved
  EXPECT_THAT(put->Commit().message(), HasSubstr("500 of 1000"));
  EXPECT_FALSE(store->Exists(1));
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.pending_puts, 0);
  EXPECT_EQ(s.put_aborted, 1);
  EXPECT_EQ(s.used_bytes, 0);
  EXPECT_TRUE(Put(*store, 1, 1000).ok());  // the key is free again
}

TEST(BlockStoreTest, OverlongAndCorruptPutsAreRefused) {
  auto store = Make(10000);
  const auto data = Content(2, 100);
  auto put = store->BeginPut(2, 100, BlockChecksum(data));
  ASSERT_TRUE(put.ok());
  std::vector<uint8_t> big(101);
  EXPECT_EQ(put->Append(big).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(put->written(), 0);
  auto corrupt = data;
  corrupt[50] ^= 1;
  ASSERT_TRUE(put->Append(corrupt).ok());
  EXPECT_EQ(put->Commit().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(store->Exists(2));
  EXPECT_EQ(put->Commit().code(), absl::StatusCode::kFailedPrecondition);  // finished
  EXPECT_EQ(store->Stats().used_bytes, 0);
}

TEST(BlockStoreTest, AbandonedWriterReleasesItsSpace) {
  auto store = Make(1000);
  {
    auto put = store->BeginPut(3, 1000, 0);
    ASSERT_TRUE(put.ok());
    EXPECT_EQ(store->BeginPut(4, 1, 0).status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(store->Stats().used_bytes, 0);
  EXPECT_TRUE(Put(*store, 4, 1000).ok());
}

TEST(BlockStoreTest, SecondWriterOfABlockSkips) {
  auto store = Make(10000);
  auto first = store->BeginPut(5, 10, BlockChecksum(Content(5, 10)));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(store->BeginPut(5, 10, 0).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(first->Append(Content(5, 10)).ok());
  ASSERT_TRUE(first->Commit().ok());
  EXPECT_EQ(Put(*store, 5, 10).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Stats().put_skipped, 2);
  EXPECT_EQ(store->Stats().puts, 1);
}

TEST(BlockStoreTest, SizesAreValidated) {
  auto store = Make(1000, 500);
  EXPECT_EQ(store->BeginPut(1, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginPut(1, -3, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginPut(1, 501, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(BlockStore::Create({.capacity_bytes = 0}).ok());
  auto small = Make(100, 500);
  EXPECT_EQ(small->BeginPut(1, 200, 0).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(BlockStoreTest, EvictsLeastRecentlyUsedFirst) {
  auto store = Make(300);
  for (uint64_t h : {1, 2, 3}) ASSERT_TRUE(Put(*store, h, 100).ok());
  ASSERT_TRUE(store->Get(1).ok());  // 1 becomes most recent once released
  ASSERT_TRUE(Put(*store, 4, 100).ok());
  EXPECT_TRUE(store->Exists(1));
  EXPECT_FALSE(store->Exists(2));
  EXPECT_TRUE(store->Exists(3));
  EXPECT_EQ(store->Stats().evictions, 1);
  ASSERT_TRUE(Put(*store, 5, 200).ok());  // evicts 3 then 1
  EXPECT_FALSE(store->Exists(3));
  EXPECT_FALSE(store->Exists(1));
  EXPECT_TRUE(store->Exists(4));
}

TEST(BlockStoreTest, PinnedBlocksAreNeverEvicted) {
  auto store = Make(200);
  ASSERT_TRUE(Put(*store, 1, 100).ok());
  ASSERT_TRUE(Put(*store, 2, 100).ok());
  auto a = store->Get(1);
  auto b = store->Get(2);
  auto b2 = store->Get(2);  // pinned twice
  ASSERT_TRUE(a.ok() && b.ok() && b2.ok());
  EXPECT_EQ(store->Stats().pinned_blocks, 2);
  EXPECT_EQ(Put(*store, 3, 100).code(), absl::StatusCode::kResourceExhausted);
  b->Reset();
  EXPECT_EQ(Put(*store, 3, 100).code(), absl::StatusCode::kResourceExhausted);  // b2 pins
  BlockRef moved = std::move(*b2);
  moved.Reset();
  ASSERT_TRUE(Put(*store, 3, 100).ok());  // evicts 2, the unpinned one
  EXPECT_TRUE(store->Exists(1));
  EXPECT_FALSE(store->Exists(2));
  EXPECT_EQ(std::vector<uint8_t>(a->data().begin(), a->data().end()), Content(1, 100));
}

// Writers and readers on overlapping keys: every read sees a whole, correct block, and the
// store ends with nothing pinned or pending and within capacity.
TEST(BlockStoreTest, ConcurrentWritersAndReaders) {
  auto store = Make(64 * 1000);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 3000; ++i) {
        const uint64_t h = rng() % 128;
        const int64_t size = 500 + static_cast<int64_t>(h % 5) * 100;
        if (rng() % 2) {
          absl::Status s = Put(*store, h, size);
          if (!s.ok() && !absl::IsAlreadyExists(s) && !absl::IsResourceExhausted(s)) ++bad;
        } else if (auto ref = store->Get(h); ref.ok()) {
          if (std::vector<uint8_t>(ref->data().begin(), ref->data().end()) != Content(h, size)) {
            ++bad;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.pinned_blocks, 0);
  EXPECT_EQ(s.pending_puts, 0);
  EXPECT_LE(s.used_bytes, s.capacity_bytes);
  EXPECT_GT(s.evictions, 0);
  EXPECT_GT(s.hits, 0);
}

}  // namespace
}  // namespace tandem::cache_store
