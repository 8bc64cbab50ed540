#include "cache_store/disk_tier.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "common/store/block_checksum.h"
#include "gtest/gtest.h"
#include "tests/unit/cache_store/faulty_disk.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::cache_store {
namespace {

constexpr int64_t kPage = kDiskAlignment;

// Block `hash`'s bytes: a little over two pages, different for every hash.
std::vector<uint8_t> BytesOf(uint64_t hash, int64_t size = 2 * kPage + 100) {
  std::vector<uint8_t> out(static_cast<size_t>(size));
  std::mt19937_64 rng(hash);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Room for `blocks` blocks of BytesOf's size (three pages each), two to a segment.
  DiskTierOptions Options(int64_t blocks, DiskFs* fs = nullptr) {
    DiskTierOptions o;
    o.directory = dir_;
    o.segment_bytes = 6 * kPage;
    o.capacity_bytes = (blocks + 1) / 2 * o.segment_bytes;
    o.fs = fs;
    return o;
  }

  std::unique_ptr<DiskTier> Open(const DiskTierOptions& o) {
    auto tier = DiskTier::Open(o);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return tier.ok() ? *std::move(tier) : nullptr;
  }

  // Writes the blocks as one batch; their statuses.
  std::vector<absl::Status> Write(DiskTier& tier, const std::vector<uint64_t>& hashes,
                                  uint64_t layout_id = 1) {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<DiskBlockWrite> writes;
    for (uint64_t h : hashes) bytes.push_back(BytesOf(h));
    for (size_t i = 0; i < hashes.size(); ++i) {
      writes.push_back({hashes[i], layout_id, bytes[i], store::BlockChecksum64(bytes[i])});
    }
    return tier.Write(writes);
  }

  // Reads the blocks as one batch; each read's status, after checking any read OK is the
  // block's own bytes.
  std::vector<absl::Status> Read(DiskTier& tier, const std::vector<uint64_t>& hashes,
                                 uint64_t layout_id = 0) {
    std::vector<std::vector<uint8_t>> out(hashes.size(), std::vector<uint8_t>(BytesOf(0).size()));
    std::vector<DiskBlockRead> reads;
    for (size_t i = 0; i < hashes.size(); ++i) {
      DiskBlockRead r;
      r.hash = hashes[i];
      r.layout_id = layout_id;
      r.out = out[i];
      reads.push_back(r);
    }
    tier.Read(reads);
    std::vector<absl::Status> statuses;
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (reads[i].status.ok()) {
        EXPECT_EQ(out[i], BytesOf(hashes[i])) << hashes[i];
        EXPECT_EQ(reads[i].checksum64, store::BlockChecksum64(out[i]));
      }
      statuses.push_back(reads[i].status);
    }
    return statuses;
  }

  // Overwrites `n` bytes of a file at `offset`.
  void Scribble(const std::string& name, int64_t offset, int n = 8) {
    std::fstream f(std::filesystem::path(dir_) / name,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(offset);
    for (int i = 0; i < n; ++i) f.put(static_cast<char>(0xA5));
  }

  const std::string dir_ = testing::MakeTempDir("disk_tier");
};

bool AllOk(const std::vector<absl::Status>& statuses) {
  for (const auto& s : statuses) {
    if (!s.ok()) return false;
  }
  return true;
}

TEST_F(DiskTierTest, WritesReadsBackAndKnowsWhatItHolds) {
  auto tier = Open(Options(8));
  ASSERT_TRUE(AllOk(Write(*tier, {1, 2, 3, 4, 5})));
  EXPECT_TRUE(absl::IsAlreadyExists(Write(*tier, {3})[0]));
  EXPECT_TRUE(tier->Contains(4));
  EXPECT_EQ(tier->SizeOf(4), BytesOf(4).size());
  EXPECT_FALSE(tier->Contains(9));
  auto reads = Read(*tier, {1, 2, 3, 4, 5, 9});
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(reads[i].ok()) << reads[i];
  EXPECT_TRUE(absl::IsNotFound(reads[5]));
  DiskTierStats s = tier->Stats();
  EXPECT_EQ(s.blocks, 5);
  EXPECT_EQ(s.writes, 5);
  EXPECT_EQ(s.hits, 5);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.used_bytes, 5 * 3 * kPage);
  EXPECT_EQ(s.capacity_bytes, 4 * 6 * kPage);
  EXPECT_EQ(s.write_bytes, 5 * static_cast<int64_t>(BytesOf(0).size()));
}

TEST_F(DiskTierTest, ARestartOnTheSameDirectoryServesTheBlocks) {
  {
    auto tier = Open(Options(8));
    ASSERT_TRUE(AllOk(Write(*tier, {1, 2, 3})));
    ASSERT_TRUE(AllOk(Write(*tier, {4})));
    tier->Erase(2);
  }
  auto tier = Open(Options(8));
  EXPECT_EQ(tier->Stats().recovered_blocks, 3);
  auto reads = Read(*tier, {1, 2, 3, 4});
  EXPECT_TRUE(reads[0].ok() && reads[2].ok() && reads[3].ok());
  EXPECT_TRUE(absl::IsNotFound(reads[1]));   // its drop was logged when the tier closed
  ASSERT_TRUE(AllOk(Write(*tier, {2, 5})));  // and the space of the recovered ones is taken
  EXPECT_TRUE(AllOk(Read(*tier, {1, 2, 3, 4, 5})));
}

TEST_F(DiskTierTest, EvictsTheLeastRecentlyUsedAcrossARestart) {
  {
    auto tier = Open(Options(4));
    ASSERT_TRUE(AllOk(Write(*tier, {1, 2, 3, 4})));
    ASSERT_TRUE(AllOk(Read(*tier, {1})));  // 2 is now the least recently used
    ASSERT_TRUE(AllOk(Write(*tier, {5})));
    EXPECT_FALSE(tier->Contains(2));
    EXPECT_TRUE(tier->Contains(1));
    EXPECT_EQ(tier->Stats().evictions, 1);
  }
  auto tier = Open(Options(4));
  EXPECT_EQ(tier->Stats().recovered_blocks, 4);
  EXPECT_FALSE(tier->Contains(2));
  // After a restart the order is the log's: 3 was written before 4, 1 (never rewritten) before
  // both, so 1 goes first now.
  ASSERT_TRUE(AllOk(Write(*tier, {6})));
  EXPECT_FALSE(tier->Contains(1));
  EXPECT_TRUE(AllOk(Read(*tier, {3, 4, 5, 6})));
}

TEST_F(DiskTierTest, ABlockLargerThanASegmentIsNotWritten) {
  auto tier = Open(Options(4));
  std::vector<uint8_t> big(7 * kPage, 1);
  DiskBlockWrite w{77, 1, big, store::BlockChecksum64(big)};
  auto out = tier->Write(std::span(&w, 1));
  EXPECT_TRUE(absl::IsResourceExhausted(out[0])) << out[0];
  EXPECT_EQ(tier->Stats().write_no_room, 1);
  EXPECT_EQ(tier->Stats().used_bytes, 0);
}

TEST_F(DiskTierTest, ChangedBytesAreACountedMissAndTheRecordIsDropped) {
  {
    auto tier = Open(Options(4));
    ASSERT_TRUE(AllOk(Write(*tier, {1, 2})));
    Scribble("segment-00000.dat", 3 * kPage + 1000);  // inside block 2 (the second slot)
    auto reads = Read(*tier, {1, 2});
    EXPECT_TRUE(reads[0].ok());
    EXPECT_TRUE(absl::IsDataLoss(reads[1])) << reads[1];
    EXPECT_EQ(tier->Stats().corrupt, 1);
    EXPECT_FALSE(tier->Contains(2));
  }
  auto tier = Open(Options(4));
  EXPECT_EQ(tier->Stats().recovered_blocks, 1);
  EXPECT_FALSE(tier->Contains(2));
}

TEST_F(DiskTierTest, AReaderOfAnotherLayoutDropsTheBlock) {
  auto tier = Open(Options(4));
  ASSERT_TRUE(AllOk(Write(*tier, {1, 2}, /*layout_id=*/11)));
  auto reads = Read(*tier, {1, 2}, /*layout_id=*/12);
  EXPECT_TRUE(absl::IsFailedPrecondition(reads[0])) << reads[0];
  EXPECT_EQ(tier->Stats().stale, 2);
  EXPECT_EQ(tier->Stats().blocks, 0);
}

TEST_F(DiskTierTest, ATornOrCorruptLogTailIsDiscardedAtOpen) {
  {
    auto tier = Open(Options(8));
    ASSERT_TRUE(AllOk(Write(*tier, {1, 2, 3})));
  }
  const auto log = std::filesystem::path(dir_) / "index.log";
  const auto size = static_cast<int64_t>(std::filesystem::file_size(log));
  {
    std::ofstream torn(log, std::ios::app | std::ios::binary);
    torn << std::string(30, 'x');
  }
  {
    auto tier = Open(Options(8));
    EXPECT_EQ(tier->Stats().recovered_blocks, 3);
    EXPECT_EQ(tier->Stats().discarded_log_bytes, 30);
  }
  EXPECT_EQ(std::filesystem::file_size(log), size);  // truncated back
  Scribble("index.log", size - 20, 1);               // the last record
  auto tier = Open(Options(8));
  EXPECT_EQ(tier->Stats().recovered_blocks, 2);
  EXPECT_FALSE(tier->Contains(3));
  EXPECT_TRUE(AllOk(Read(*tier, {1, 2})));
}

TEST_F(DiskTierTest, AnotherGeometryStartsEmptyAndRemovesSegmentsItNoLongerHas) {
  {
    auto tier = Open(Options(8));
    ASSERT_TRUE(AllOk(Write(*tier, {1, 2, 3})));
  }
  ASSERT_TRUE(std::filesystem::exists(std::filesystem::path(dir_) / "segment-00003.dat"));
  auto tier = Open(Options(4));
  EXPECT_EQ(tier->Stats().recovered_blocks, 0);
  EXPECT_EQ(tier->Stats().blocks, 0);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir_) / "segment-00003.dat"));
  EXPECT_TRUE(AllOk(Write(*tier, {1})));
}

TEST_F(DiskTierTest, AFullDiskSkipsTheBlockAndLaterWritesSucceed) {
  std::atomic<bool> full{true};
  FaultyDiskFs fs([&](int64_t, FaultyDiskFs::Op op, const std::string& path) {
    const bool segment = path.find("segment-") != std::string::npos;
    return full && segment && op == FaultyDiskFs::Op::kWrite
               ? absl::ResourceExhaustedError("No space left on device")
               : absl::OkStatus();
  });
  auto tier = Open(Options(4, &fs));
  auto out = Write(*tier, {1, 2});
  EXPECT_TRUE(absl::IsResourceExhausted(out[0])) << out[0];
  EXPECT_EQ(tier->Stats().write_failures, 2);
  EXPECT_EQ(tier->Stats().used_bytes, 0);
  EXPECT_FALSE(tier->Contains(1));
  full = false;
  EXPECT_TRUE(AllOk(Write(*tier, {1, 2})));
  EXPECT_TRUE(AllOk(Read(*tier, {1, 2})));
}

// A script of writes, reads and an erase that evicts: the same for every crash point below.
// Returns the hashes whose writes reported success.
void RunScript(DiskTier& tier, std::vector<uint64_t>* stored) {
  const std::vector<std::vector<uint64_t>> batches = {{1, 2, 3}, {4, 5}, {6}, {7, 8}};
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<DiskBlockWrite> writes;
    for (uint64_t h : batches[b]) bytes.push_back(BytesOf(h));
    for (size_t i = 0; i < bytes.size(); ++i) {
      writes.push_back({batches[b][i], 1, bytes[i], store::BlockChecksum64(bytes[i])});
    }
    auto out = tier.Write(writes);
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].ok()) stored->push_back(batches[b][i]);
    }
    if (b == 1) tier.Erase(2);
  }
}

// Crash the tier at every mutating step of its life (opening, each block's write, each sync,
// each log append, a truncation): a restart on the directory serves only intact blocks (a
// record whose space was rewritten before its drop was logged fails its checksum: a miss), every
// block whose write reported success and that the script did not evict or erase, and takes new
// writes.
TEST_F(DiskTierTest, ACrashAtAnyStepLeavesAConsistentRecoverableTier) {
  int64_t total = 0;
  std::vector<int64_t> ops_after_batch;
  {
    FaultyDiskFs counting;
    auto tier = Open(Options(4, &counting));
    std::vector<uint64_t> stored;
    RunScript(*tier, &stored);
    ASSERT_EQ(stored.size(), 8u);
    total = counting.operations();
  }
  ASSERT_GT(total, 12);
  for (int64_t crash_at = 1; crash_at <= total + 1; ++crash_at) {
    SCOPED_TRACE(crash_at);
    std::filesystem::remove_all(dir_);
    std::vector<uint64_t> stored;
    {
      FaultyDiskFs fs(
          [&](int64_t n, FaultyDiskFs::Op, const std::string&) {
            return n == crash_at ? absl::UnavailableError("crash") : absl::OkStatus();
          },
          /*crash=*/true);
      absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(Options(4, &fs));
      if (tier.ok()) RunScript(**tier, &stored);
    }
    auto tier = Open(Options(4));
    ASSERT_NE(tier, nullptr);
    std::vector<uint64_t> all = {1, 2, 3, 4, 5, 6, 7, 8};
    auto reads = Read(*tier, all);  // checks the bytes of every block found
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_TRUE(reads[i].ok() || absl::IsNotFound(reads[i]) || absl::IsDataLoss(reads[i]))
          << all[i] << ": " << reads[i];
    }
    // The last blocks a crash-free run keeps are 5..8 (4 slots; 2 erased, 1..3 evicted); each
    // one whose write reported success before the crash must be there.
    for (uint64_t h : stored) {
      if (h >= 5) {
        EXPECT_TRUE(tier->Contains(h)) << h;
      }
    }
    EXPECT_TRUE(AllOk(Write(*tier, {9})));
    EXPECT_TRUE(AllOk(Read(*tier, {9})));
  }
}

// One step fails (EIO) and the tier goes on: nothing wrong is served, now or after a restart.
TEST_F(DiskTierTest, AFailedStepLosesOnlyItsBlocks) {
  for (int64_t fail_at = 1; fail_at <= 40; ++fail_at) {
    SCOPED_TRACE(fail_at);
    std::filesystem::remove_all(dir_);
    FaultyDiskFs fs([&](int64_t n, FaultyDiskFs::Op, const std::string&) {
      return n == fail_at ? absl::InternalError("Input/output error") : absl::OkStatus();
    });
    std::vector<uint64_t> stored;
    {
      absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(Options(4, &fs));
      if (!tier.ok()) continue;  // a failure while opening is reported, nothing more
      RunScript(**tier, &stored);
      for (const auto& s : Read(**tier, {1, 2, 3, 4, 5, 6, 7, 8})) {
        EXPECT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
      }
    }
    auto tier = Open(Options(4));
    for (const auto& s : Read(*tier, {1, 2, 3, 4, 5, 6, 7, 8})) {
      EXPECT_TRUE(s.ok() || absl::IsNotFound(s) || absl::IsDataLoss(s)) << s;
    }
  }
}

TEST_F(DiskTierTest, TheLogIsCompactedAndStaysSmall) {
  DiskTierOptions o = Options(4);
  o.compact_log_records = 64;
  {
    auto tier = Open(o);
    for (uint64_t h = 1; h <= 400; h += 2) ASSERT_TRUE(AllOk(Write(*tier, {h, h + 1})));
  }
  // Each batch logs two puts and two drops: 400 blocks are ~800 records unless compacted.
  EXPECT_LE(std::filesystem::file_size(std::filesystem::path(dir_) / "index.log"),
            kDiskLogHeaderBytes + 64 * kDiskLogRecordBytes);
  auto tier = Open(o);
  EXPECT_EQ(tier->Stats().recovered_blocks, 4);
  EXPECT_TRUE(AllOk(Read(*tier, {397, 398, 399, 400})));
}

// A writer evicting while readers read: every read is the block's own bytes or a miss.
TEST_F(DiskTierTest, ConcurrentReadsAndWritesServeOnlyTheRightBytes) {
  DiskTierOptions o = Options(8);
  o.io_threads = 3;
  auto tier = Open(o);
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    for (uint64_t h = 1; h <= 300; h += 3) {
      Write(*tier, {h, h + 1, h + 2});
      written = h + 2;
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(r);
      while (written < 300) {
        const uint64_t top = std::max<uint64_t>(written, 1);
        std::vector<uint64_t> hashes;
        for (int i = 0; i < 4; ++i) hashes.push_back(1 + rng() % top);
        for (const auto& s : Read(*tier, hashes)) EXPECT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(tier->Stats().corrupt, 0);
  EXPECT_GT(tier->Stats().evictions, 0);
}

}  // namespace
}  // namespace tandem::cache_store
