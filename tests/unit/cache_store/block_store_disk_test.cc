// A BlockStore with a disk tier behind its memory: spilling, promotion, restarts.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache_store/block_store.h"
#include "common/store/block_checksum.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::cache_store {
namespace {

constexpr int64_t kBlock = 5000;  // two disk pages

std::vector<uint8_t> Content(uint64_t hash) {
  std::vector<uint8_t> v(kBlock);
  for (int64_t i = 0; i < kBlock; ++i) v[i] = static_cast<uint8_t>((hash * 131 + i * 7) >> 1);
  return v;
}

absl::Status Put(BlockStore& store, uint64_t hash) {
  const auto data = Content(hash);
  auto put = store.BeginPut(hash, kBlock, store::BlockChecksum(data));
  if (!put.ok()) return put.status();
  if (auto s = put->Append(data); !s.ok()) return s;
  return put->Commit();
}

// Get's status, after checking that a block found is its own bytes.
absl::Status GetAndCheck(BlockStore& store, uint64_t hash) {
  auto ref = store.Get(hash, ChecksumKind::kXxh3);
  if (!ref.ok()) return ref.status();
  EXPECT_EQ(std::vector<uint8_t>(ref->data().begin(), ref->data().end()), Content(hash)) << hash;
  EXPECT_EQ(ref->checksum64(), store::BlockChecksum64(Content(hash)));
  return absl::OkStatus();
}

class BlockStoreDiskTest : public ::testing::TestWithParam<bool> {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Memory for `memory_blocks` blocks, disk for `disk_blocks` (two pages each).
  std::unique_ptr<BlockStore> Make(int memory_blocks = 4, int disk_blocks = 16) {
    BlockStoreOptions o;
    o.capacity_bytes = memory_blocks * (kBlock + 64);
    o.max_block_bytes = kBlock;
    o.shared_memory = GetParam();
    o.disk.directory = dir_;
    o.disk.segment_bytes = 8 * kDiskAlignment;
    o.disk.capacity_bytes = disk_blocks * 2 * kDiskAlignment;
    auto s = BlockStore::Create(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Puts blocks one at a time, each written to disk before the next evicts anything.
  void PutSpilled(BlockStore& store, uint64_t first, uint64_t last) {
    for (uint64_t h = first; h <= last; ++h) {
      ASSERT_TRUE(Put(store, h).ok()) << h;
      const int64_t want = store.Stats().puts;
      ASSERT_TRUE(testing::Eventually([&] { return store.Stats().spilled == want; })) << h;
    }
  }

  const std::string dir_ = testing::MakeTempDir("block_store_disk");
};

TEST_P(BlockStoreDiskTest, BlocksEvictedFromMemoryAreServedFromDisk) {
  auto store = Make();
  PutSpilled(*store, 1, 12);
  BlockStoreStats s = store->Stats();
  EXPECT_TRUE(s.has_disk);
  EXPECT_EQ(s.blocks, 4);
  EXPECT_EQ(s.evictions, 8);
  EXPECT_EQ(s.evicted_unspilled, 0);
  EXPECT_EQ(s.disk.blocks, 12);
  for (uint64_t h = 1; h <= 12; ++h) {
    EXPECT_TRUE(store->Exists(h)) << h;
    EXPECT_TRUE(GetAndCheck(*store, h).ok()) << h;  // a slower hit, not a miss
  }
  s = store->Stats();
  EXPECT_EQ(s.hits, 12);
  EXPECT_EQ(s.misses, 0);
  EXPECT_GE(s.promoted, 8);
  EXPECT_EQ(s.disk.writes, 12);  // promoted blocks are not written again
  EXPECT_TRUE(absl::IsNotFound(store->Get(99).status()));
  EXPECT_EQ(store->Stats().misses, 1);
}

TEST_P(BlockStoreDiskTest, PromoteReadsABatchBackAtOnce) {
  auto store = Make(/*memory_blocks=*/8);
  PutSpilled(*store, 1, 12);  // 1..4 are on disk only
  const std::vector<uint64_t> hashes = {1, 2, 3, 4, 9, 77};
  const int64_t reads_before = store->Stats().disk.hits;
  // What this call read back, per hash: the tier a reader of each block reports.
  EXPECT_EQ(store->Promote(hashes), (std::vector<bool>{true, true, true, true, false, false}));
  BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.disk.hits - reads_before, 4);  // 9 is in memory, 77 nowhere
  EXPECT_EQ(s.promoted, 4);
  const int64_t disk_hits = s.disk.hits;
  for (uint64_t h : {1, 2, 3, 4}) EXPECT_TRUE(GetAndCheck(*store, h).ok()) << h;
  EXPECT_EQ(store->Stats().disk.hits, disk_hits);  // all from memory now
  EXPECT_EQ(store->Promote(hashes), std::vector<bool>(hashes.size(), false));
}

// An RPC thread hands the disk reads to the store's promote threads and is answered there;
// with nothing on disk only, it is answered at once, on its own thread.
TEST_P(BlockStoreDiskTest, PromoteThenReadsOnThePromoteThreads) {
  auto store = Make(/*memory_blocks=*/8);
  PutSpilled(*store, 1, 12);  // 1..4 are on disk only
  const std::thread::id caller = std::this_thread::get_id();
  absl::Mutex mu;
  std::optional<std::vector<bool>> answer;
  std::thread::id answered_on;
  auto done = [&](std::vector<bool> from_disk) {
    absl::MutexLock lock(&mu);
    answer = std::move(from_disk);
    answered_on = std::this_thread::get_id();
  };
  store->PromoteThen({9, 1, 77, 2}, done);
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::optional<std::vector<bool>>* a) { return a->has_value(); }, &answer),
        absl::Seconds(30)));
    EXPECT_EQ(*answer, (std::vector<bool>{false, true, false, true}));
    EXPECT_NE(answered_on, caller);
    answer.reset();
  }
  for (uint64_t h : {1, 2}) EXPECT_TRUE(GetAndCheck(*store, h).ok()) << h;
  store->PromoteThen({9, 1, 77}, done);  // in memory, in memory, nowhere: nothing to read
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(*answer, std::vector<bool>(3, false));
  EXPECT_EQ(answered_on, caller);
}

// Promotions still queued when the store goes run first: their callers are answered.
TEST_P(BlockStoreDiskTest, QueuedPromotionsRunBeforeTheStoreGoes) {
  auto store = Make(/*memory_blocks=*/4);
  PutSpilled(*store, 1, 12);  // 1..8 are on disk only
  std::atomic<int> answered = 0;
  for (uint64_t h = 1; h <= 8; ++h) {
    store->PromoteThen({h}, [&](std::vector<bool>) { answered.fetch_add(1); });
  }
  store.reset();
  EXPECT_EQ(answered.load(), 8);
}

TEST_P(BlockStoreDiskTest, AWriterOfABlockOnDiskSkipsIt) {
  auto store = Make();
  PutSpilled(*store, 1, 6);  // 1 and 2 are on disk only
  auto put = store->BeginPut(1, kBlock, 0);
  EXPECT_TRUE(absl::IsAlreadyExists(put.status())) << put.status();
  EXPECT_EQ(store->Stats().put_skipped, 1);
}

TEST_P(BlockStoreDiskTest, ARestartedStoreServesWhatItsDiskHolds) {
  {
    auto store = Make();
    PutSpilled(*store, 1, 6);
  }
  auto store = Make();
  EXPECT_EQ(store->Stats().disk.recovered_blocks, 6);
  EXPECT_EQ(store->Stats().blocks, 0);
  for (uint64_t h = 1; h <= 6; ++h) EXPECT_TRUE(GetAndCheck(*store, h).ok()) << h;
}

TEST_P(BlockStoreDiskTest, ABlockChangedOnDiskIsAMiss) {
  {
    auto store = Make();
    PutSpilled(*store, 1, 2);
  }
  {  // block 1 is the first on disk: its first page
    std::fstream f(std::filesystem::path(dir_) / "segment-00000.dat",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
    f.put('\xa5');
  }
  auto store = Make();
  EXPECT_TRUE(absl::IsNotFound(store->Get(1).status()));
  EXPECT_TRUE(GetAndCheck(*store, 2).ok());
  BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.disk.corrupt, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_FALSE(store->Exists(1));
}

// Writers and readers at once while the spill thread writes and Gets promote: every block read
// is its own bytes.
TEST_P(BlockStoreDiskTest, ConcurrentPutsAndGetsWithSpillingAndPromotion) {
  auto store = Make(/*memory_blocks=*/6, /*disk_blocks=*/64);
  std::atomic<uint64_t> top{0};
  std::thread writer([&] {
    // The spill count as a window of 20 puts began: the window's last block stays in memory
    // while the writer waits, so it is spilled after that. Read after the window instead, the
    // count of a spill thread that had already caught up would never move again.
    BlockStoreStats window = store->Stats();
    for (uint64_t h = 1; h <= 200; ++h) {
      absl::Status s = Put(*store, h);
      EXPECT_TRUE(s.ok() || absl::IsAlreadyExists(s) || absl::IsResourceExhausted(s)) << s;
      top = h;
      if (h % 20 == 0) {  // let the disk catch up now and then, so reads find blocks there
        EXPECT_TRUE(testing::Eventually([&] { return store->Stats().spilled > window.spilled; }));
        window = store->Stats();
      }
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      uint64_t x = 12345 + r;
      while (top < 200) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        const uint64_t h = 1 + (x >> 33) % std::max<uint64_t>(top, 1);
        if (r == 0) {
          absl::Status s = GetAndCheck(*store, h);
          EXPECT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
        } else {
          const std::vector<uint64_t> batch = {h, h + 1, h + 2};
          store->Promote(batch);
        }
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
  BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.disk.corrupt, 0);
  EXPECT_GT(s.spilled, 0);
  EXPECT_GT(s.promoted, 0);
  // Puts faster than the disk lose blocks to eviction before they are written; counted.
  EXPECT_EQ(s.puts, s.blocks + s.evictions - s.promoted + s.corrupt);
}

INSTANTIATE_TEST_SUITE_P(Memory, BlockStoreDiskTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Shared" : "Private"; });

}  // namespace
}  // namespace tandem::cache_store
