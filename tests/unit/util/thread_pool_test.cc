#include "common/util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, RespectsGrainAndRepeatsManyTimes) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep) {
    pool.ParallelFor(10, 8, [&](int64_t b, int64_t e) {
      EXPECT_TRUE(e - b >= 2 || e == 10);
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
    });
  }
  EXPECT_EQ(sum.load(), 2000 * 45);
}

TEST(ThreadPoolTest, SingleThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  int calls = 0;
  pool.ParallelFor(50, 1, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 50);
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(ThreadPoolTest, DynamicCoversEveryIndexOnceInChunks) {
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 64, 1000}) {
    for (int64_t chunk : {1, 7, 64}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> calls{0};
      pool.ParallelForDynamic(n, chunk, [&](int64_t b, int64_t e) {
        EXPECT_TRUE(b % chunk == 0);
        EXPECT_TRUE(e % chunk == 0 || e == n);
        calls.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << chunk;
      EXPECT_LE(calls.load(), (n + chunk - 1) / chunk);
    }
  }
}

// Guided takes: a thousand chunks cost tens of takes (each a share of what is left, so at most
// about 8 ln(1000 / 8) + 8 with two threads), the last ones single chunks.
TEST(ThreadPoolTest, DynamicTakesShrinkingShares) {
  ThreadPool pool(2);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.ParallelForDynamic(1000, 1, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  ASSERT_FALSE(ranges.empty());
  EXPECT_LE(ranges.size(), 64u);
  EXPECT_EQ(ranges.front().first, 0);
  EXPECT_EQ(ranges.front().second, 1000 / 8);  // the first take: an eighth of everything
  EXPECT_EQ(ranges.back().second - ranges.back().first, 1);
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
    EXPECT_LE(ranges[i].second - ranges[i].first, ranges[i - 1].second - ranges[i - 1].first);
  }
}

}  // namespace
}  // namespace tandem
