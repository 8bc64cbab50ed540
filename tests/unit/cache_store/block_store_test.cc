#include "cache_store/block_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cache_store/arena_allocator.h"
#include "common/store/shm_layout.h"
#include "common/util/populate.h"

namespace tandem::cache_store {
namespace {

using ::testing::HasSubstr;

// Deterministic content of block `hash`, so readers can check what they got.
std::vector<uint8_t> Content(uint64_t hash, int64_t size) {
  std::vector<uint8_t> v(size);
  for (int64_t i = 0; i < size; ++i) v[i] = static_cast<uint8_t>((hash * 131 + i * 7) >> 1);
  return v;
}

std::unique_ptr<BlockStore> MakeStore(int64_t capacity, int64_t max_block, bool shared_memory) {
  auto s = BlockStore::Create(
      {.capacity_bytes = capacity, .max_block_bytes = max_block, .shared_memory = shared_memory});
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->arena() != nullptr, shared_memory);
  return std::move(s).value();
}

// Every behaviour holds whether blocks live in private memory or in the shared arena.
class BlockStoreTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<BlockStore> Make(int64_t capacity, int64_t max_block = 1 << 20) {
    return MakeStore(capacity, max_block, GetParam());
  }
};

absl::Status Put(BlockStore& store, uint64_t hash, int64_t size) {
  const auto data = Content(hash, size);
  auto put = store.BeginPut(hash, size, store::BlockChecksum(data));
  if (!put.ok()) return put.status();
  for (int64_t off = 0; off < size; off += 100) {
    const int64_t n = std::min<int64_t>(100, size - off);
    if (auto s = put->Append({data.data() + off, static_cast<size_t>(n)}); !s.ok()) return s;
  }
  return put->Commit();
}

TEST_P(BlockStoreTest, PutThenGetReturnsTheBytes) {
  auto store = Make(10000);
  ASSERT_TRUE(Put(*store, 7, 1000).ok());
  EXPECT_TRUE(store->Exists(7));
  auto ref = store->Get(7);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(std::vector<uint8_t>(ref->data().begin(), ref->data().end()), Content(7, 1000));
  EXPECT_EQ(ref->checksum(), store::BlockChecksum(Content(7, 1000)));
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

TEST_P(BlockStoreTest, APartialBlockIsNeverVisible) {
  auto store = Make(10000);
  const auto data = Content(1, 1000);
  auto put = store->BeginPut(1, 1000, store::BlockChecksum(data));
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

TEST_P(BlockStoreTest, OverlongAndCorruptPutsAreRefused) {
  auto store = Make(10000);
  const auto data = Content(2, 100);
  auto put = store->BeginPut(2, 100, store::BlockChecksum(data));
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

TEST_P(BlockStoreTest, AbandonedWriterReleasesItsSpace) {
  auto store = Make(1000);
  {
    auto put = store->BeginPut(3, 1000, 0);
    ASSERT_TRUE(put.ok());
    EXPECT_EQ(store->BeginPut(4, 1, 0).status().code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(store->Stats().used_bytes, 0);
  EXPECT_TRUE(Put(*store, 4, 1000).ok());
}

TEST_P(BlockStoreTest, AWriterOfAStoredBlockSkipsIt) {
  auto store = Make(10000);
  ASSERT_TRUE(Put(*store, 5, 10).ok());
  EXPECT_EQ(Put(*store, 5, 10).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->BeginPut(5, 10, 0, WhilePending::kSkip).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Stats().put_skipped, 2);
  EXPECT_EQ(store->Stats().puts, 1);
}

// The shared-prefix race: A reserved a block before computing it; B has the bytes first. B's
// put stores the block at once, A's later commit frees its copy, and nobody waits on the other.
TEST_P(BlockStoreTest, AWriterWithTheBytesDoesNotWaitForOneStillWriting) {
  auto store = Make(10000);
  const auto data = Content(5, 10);
  auto a = store->BeginPut(5, 10, store::BlockChecksum(data));
  ASSERT_TRUE(a.ok());
  // Reserving ahead leaves the block to A.
  EXPECT_EQ(store->BeginPut(5, 10, 0, WhilePending::kSkip).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_FALSE(store->Exists(5));
  ASSERT_TRUE(Put(*store, 5, 10).ok());  // B: its own space, committed first
  EXPECT_TRUE(store->Exists(5));
  EXPECT_EQ(store->Stats().used_bytes, 20);  // both copies until A finishes
  ASSERT_TRUE(a->Append(data).ok());
  ASSERT_TRUE(a->Commit().ok());
  BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.used_bytes, 10);
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(s.pending_puts, 0);
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.duplicate_puts, 1);
  auto ref = store->Get(5);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(std::vector<uint8_t>(ref->data().begin(), ref->data().end()), data);
}

TEST_P(BlockStoreTest, TheLastOfSeveralWritersToGiveUpLeavesNothing) {
  auto store = Make(10000);
  {
    auto a = store->BeginPut(6, 100, 0);
    auto b = store->BeginPut(6, 100, 0);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(store->Stats().pending_puts, 2);
  }
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.used_bytes, 0);
  EXPECT_EQ(s.pending_puts, 0);
  EXPECT_EQ(s.put_aborted, 2);
  EXPECT_EQ(s.blocks, 0);
  EXPECT_TRUE(Put(*store, 6, 100).ok());
}

// A writer that began before its block was evicted (or found corrupt) stores it again.
TEST_P(BlockStoreTest, AWriterOutlivesTheEvictionOfItsBlock) {
  auto store = Make(300);
  const auto data = Content(1, 100);
  auto a = store->BeginPut(1, 100, store::BlockChecksum(data));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Put(*store, 1, 100).ok());
  ASSERT_TRUE(Put(*store, 2, 100).ok());  // 300 of 300 bytes: A's copy, 1, 2
  ASSERT_TRUE(Put(*store, 3, 100).ok());  // evicts 1; A still writes it
  EXPECT_FALSE(store->Exists(1));
  EXPECT_EQ(store->Stats().evictions, 1);
  ASSERT_TRUE(a->Append(data).ok());
  ASSERT_TRUE(a->Commit().ok());
  EXPECT_TRUE(store->Exists(1));
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.used_bytes, 300);
  EXPECT_EQ(s.puts, 4);
  EXPECT_EQ(s.duplicate_puts, 0);
}

TEST_P(BlockStoreTest, SizesAreValidated) {
  auto store = Make(1000, 500);
  EXPECT_EQ(store->BeginPut(1, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginPut(1, -3, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginPut(1, 501, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(BlockStore::Create({.capacity_bytes = 0, .shared_memory = GetParam()}).ok());
  auto small = Make(100, 500);
  EXPECT_EQ(small->BeginPut(1, 200, 0).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(BlockStorePreallocateTest, TheArenaIsHeldFromTheStartOrTheStoreIsNotCreated) {
  auto held = BlockStore::Create({.capacity_bytes = 4 << 20, .preallocate = true});
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_NE((*held)->arena(), nullptr);
  EXPECT_TRUE((*held)->arena()->preallocated());
  // More than the machine (or the container) has: refused at once, with what was asked for, not
  // left to the OOM killer, and not quietly kept in private memory instead.
  const int64_t too_much = AvailableMemoryBytes() + (int64_t{1} << 30);
  auto refused = BlockStore::Create({.capacity_bytes = too_much, .preallocate = true});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::AllOf(::testing::HasSubstr("cache_store.preallocate needs"),
                               ::testing::HasSubstr("MiB are available")));
  // Private memory is allocated block by block: the option has nothing to do there.
  auto private_memory =
      BlockStore::Create({.capacity_bytes = 1 << 20, .shared_memory = false, .preallocate = true});
  ASSERT_TRUE(private_memory.ok()) << private_memory.status();
  EXPECT_EQ((*private_memory)->arena(), nullptr);
}

TEST_P(BlockStoreTest, EvictsLeastRecentlyUsedFirst) {
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

TEST_P(BlockStoreTest, PinnedBlocksAreNeverEvicted) {
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
TEST_P(BlockStoreTest, ConcurrentWritersAndReaders) {
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
        } else if (rng() % 4 == 0) {  // a writer that gives up, alongside the others
          auto put = store->BeginPut(h, size, 0,
                                     rng() % 2 ? WhilePending::kSkip : WhilePending::kWriteToo);
          if (put.ok() && rng() % 2) (void)put->Append(Content(h, size));
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

// Bytes written in place (as a shared-memory client does) are checked against their XXH3-64,
// and a block written with one checksum kind can be read with the other.
TEST_P(BlockStoreTest, CommitInPlaceChecksTheXxh3AndBothChecksumsServe) {
  auto store = Make(10000);
  const auto data = Content(9, 1000);
  auto put = store->BeginPut(9, 1000, 0);
  ASSERT_TRUE(put.ok());
  std::memcpy(put->data().data(), data.data(), data.size());
  EXPECT_FALSE(store->Exists(9));
  ASSERT_TRUE(put->CommitInPlace(store::BlockChecksum64(data)).ok());
  auto ref = store->Get(9, ChecksumKind::kXxh3);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->checksum64(), store::BlockChecksum64(data));
  auto ref32 = store->Get(9);  // computed on demand
  ASSERT_TRUE(ref32.ok());
  EXPECT_EQ(ref32->checksum(), store::BlockChecksum(data));
  EXPECT_EQ(std::vector<uint8_t>(ref32->data().begin(), ref32->data().end()), data);

  ASSERT_TRUE(Put(*store, 10, 500).ok());  // through Append: XXH32 known, XXH3 on demand
  auto ref64 = store->Get(10, ChecksumKind::kXxh3);
  ASSERT_TRUE(ref64.ok());
  EXPECT_EQ(ref64->checksum64(), store::BlockChecksum64(Content(10, 500)));

  auto bad = store->BeginPut(11, 100, 0);
  ASSERT_TRUE(bad.ok());
  std::memset(bad->data().data(), 7, 100);
  EXPECT_EQ(bad->CommitInPlace(12345).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(store->Exists(11));
  EXPECT_EQ(store->Stats().used_bytes, 1500);
}

// Shared memory is writable by every attached client: bytes changed after their commit are
// caught when a reader first needs the other checksum kind, and the block is dropped.
TEST_P(BlockStoreTest, BytesChangedAfterCommitAreCaughtAndDropped) {
  auto store = Make(10000);
  const auto data = Content(4, 2000);
  auto put = store->BeginPut(4, 2000, 0);
  ASSERT_TRUE(put.ok());
  std::span<uint8_t> bytes = put->data();
  std::memcpy(bytes.data(), data.data(), data.size());
  ASSERT_TRUE(put->CommitInPlace(store::BlockChecksum64(data)).ok());
  bytes[1234] ^= 0x40;  // a rogue writer
  EXPECT_EQ(store->Get(4).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(store->Exists(4));
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.corrupt, 1);
  EXPECT_EQ(s.used_bytes, 0);
  EXPECT_EQ(s.pinned_blocks, 0);
  ASSERT_TRUE(Put(*store, 4, 2000).ok());  // it can be written again
}

INSTANTIATE_TEST_SUITE_P(Memory, BlockStoreTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Shared" : "Private";
                         });

TEST(BlockStoreArenaTest, BlockBytesLiveInTheArena) {
  auto store = MakeStore(1 << 20, 1 << 20, true);
  ASSERT_TRUE(Put(*store, 1, 1000).ok());
  auto ref = store->Get(1);
  ASSERT_TRUE(ref.ok());
  const ShmArena* arena = store->arena();
  const int64_t offset = arena->FileOffset(ref->data().data());
  EXPECT_GE(offset, store::kShmHeaderBytes);
  EXPECT_LE(offset + 1000, arena->file_bytes());
  EXPECT_EQ(offset % ArenaAllocator::kAlignment, 0);
}

// In an arena a block needs one free range: when pinned blocks split the free space, the store
// evicts further (oldest first) until a range fits, and refuses when only pinned ones are left.
TEST(BlockStoreArenaTest, FragmentationEvictsUntilARangeFits) {
  auto store = MakeStore(4096, 4096, true);
  for (uint64_t h : {1, 2, 3, 4}) ASSERT_TRUE(Put(*store, h, 1024).ok());  // fills the arena
  auto b = store->Get(2);
  auto d = store->Get(4);
  ASSERT_TRUE(b.ok() && d.ok());
  // 1 and 3 go, yet their ranges are not adjacent: 2048 bytes fit the capacity, not the arena.
  EXPECT_EQ(Put(*store, 5, 2048).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(store->Exists(1));
  EXPECT_FALSE(store->Exists(3));
  b->Reset();
  ASSERT_TRUE(Put(*store, 5, 2048).ok());  // evicts 2 as well
  EXPECT_FALSE(store->Exists(2));
  EXPECT_TRUE(store->Exists(4));
  EXPECT_EQ(std::vector<uint8_t>(d->data().begin(), d->data().end()), Content(4, 1024));
  const BlockStoreStats s = store->Stats();
  EXPECT_EQ(s.used_bytes, 1024 + 2048);
  EXPECT_EQ(s.evictions, 3);
}

}  // namespace
}  // namespace tandem::cache_store
