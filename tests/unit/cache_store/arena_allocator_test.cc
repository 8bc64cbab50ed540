#include "cache_store/arena_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace tandem::cache_store {
namespace {

constexpr int64_t kA = ArenaAllocator::kAlignment;

TEST(ArenaAllocatorTest, AllocatesAlignedRangesUntilFull) {
  ArenaAllocator arena(10 * kA + 5);  // the odd tail is unusable
  EXPECT_EQ(arena.size(), 10 * kA);
  EXPECT_EQ(arena.Allocate(1), 0);
  EXPECT_EQ(arena.Allocate(kA + 1), kA);  // rounded up to two lines
  EXPECT_EQ(arena.Allocate(7 * kA), 3 * kA);
  EXPECT_EQ(arena.free_bytes(), 0);
  EXPECT_FALSE(arena.Allocate(1).has_value());
}

TEST(ArenaAllocatorTest, FreeCoalescesNeighboursAndBestFitKeepsLargeRanges) {
  ArenaAllocator arena(8 * kA);
  std::vector<int64_t> at;
  for (int i = 0; i < 8; ++i) at.push_back(*arena.Allocate(kA));
  arena.Free(at[1], kA);
  arena.Free(at[2], kA);  // joins 1: a 2-line hole
  arena.Free(at[5], kA);  // a 1-line hole
  EXPECT_EQ(arena.largest_free_range(), 2 * kA);
  EXPECT_EQ(arena.Allocate(kA), at[5]);  // best fit: the small hole, not the pair
  EXPECT_EQ(arena.Allocate(2 * kA), at[1]);
  EXPECT_FALSE(arena.Allocate(1).has_value());
  for (int i : {0, 1, 2, 3, 4, 5, 6, 7}) arena.Free(at[i], kA);
  EXPECT_EQ(arena.largest_free_range(), 8 * kA);  // one range again
}

// Random allocations and frees against a line-by-line reference: ranges never overlap, stay
// inside the arena, and Allocate fails only when no free run of lines is long enough.
TEST(ArenaAllocatorTest, MatchesAReferenceUnderRandomUse) {
  constexpr int kLines = 256;
  ArenaAllocator arena(kLines * kA);
  std::vector<bool> used(kLines, false);
  std::map<int64_t, int64_t> live;  // offset -> size asked
  std::mt19937 rng(7);
  auto longest_run = [&] {
    int best = 0, run = 0;
    for (bool u : used) best = std::max(best, run = u ? 0 : run + 1);
    return best;
  };
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 2) {
      const int64_t size = 1 + rng() % (8 * kA);
      const int64_t lines = (size + kA - 1) / kA;
      const std::optional<int64_t> off = arena.Allocate(size);
      if (!off) {
        ASSERT_LT(longest_run(), lines) << step;
        continue;
      }
      ASSERT_EQ(*off % kA, 0);
      ASSERT_LE(*off / kA + lines, kLines);
      for (int64_t l = *off / kA; l < *off / kA + lines; ++l) {
        ASSERT_FALSE(used[l]) << "overlap at step " << step;
        used[l] = true;
      }
      live[*off] = size;
    } else {
      auto it = std::next(live.begin(), rng() % live.size());
      arena.Free(it->first, it->second);
      for (int64_t l = it->first / kA; l < it->first / kA + (it->second + kA - 1) / kA; ++l) {
        used[l] = false;
      }
      live.erase(it);
    }
    int64_t free_lines = 0;
    for (bool u : used) free_lines += u ? 0 : 1;
    ASSERT_EQ(arena.free_bytes(), free_lines * kA);
    ASSERT_EQ(arena.largest_free_range(), longest_run() * kA);  // fully coalesced
  }
}

TEST(ArenaAllocatorTest, AllocateAtTakesAFreeRangeAndSplitsItsNeighbours) {
  constexpr int64_t kPage = 4096;
  ArenaAllocator arena(8 * kPage, kPage);
  ASSERT_TRUE(arena.AllocateAt(2 * kPage, 100));  // rounds to a page
  EXPECT_FALSE(arena.AllocateAt(2 * kPage, kPage));
  EXPECT_FALSE(arena.AllocateAt(kPage, 2 * kPage));      // overlaps the page taken
  EXPECT_FALSE(arena.AllocateAt(7 * kPage, 2 * kPage));  // past the end
  ASSERT_TRUE(arena.AllocateAt(5 * kPage, 2 * kPage));
  EXPECT_EQ(arena.free_bytes(), 5 * kPage);
  EXPECT_EQ(arena.largest_free_range(), 2 * kPage);  // [0, 2) and [3, 5) and [7, 8)
  EXPECT_EQ(arena.Allocate(2 * kPage), 0);           // best fit: the first of the two
  EXPECT_EQ(arena.Allocate(2 * kPage), 3 * kPage);
  EXPECT_EQ(arena.Allocate(kPage), 7 * kPage);
  EXPECT_EQ(arena.Allocate(1), std::nullopt);
  arena.Free(2 * kPage, 100);
  EXPECT_EQ(arena.Allocate(kPage), 2 * kPage);
}

}  // namespace
}  // namespace tandem::cache_store
