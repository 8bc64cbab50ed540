#include "common/util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
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

// Each thread walks up through runs of neighbouring chunks: its own share, then the back
// halves it takes from others, a quarter of what is left of the run at a time. A thousand
// chunks cost a few runs and tens of takes per run, not a take per chunk.
TEST(ThreadPoolTest, DynamicWalksUpThroughContiguousRuns) {
  ThreadPool pool(2);
  for (int rep = 0; rep < 20; ++rep) {
    std::mutex mu;
    std::map<std::thread::id, std::vector<std::pair<int64_t, int64_t>>> by_thread;
    pool.ParallelForDynamic(1000, 1, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      by_thread[std::this_thread::get_id()].emplace_back(b, e);
    });
    std::vector<std::pair<int64_t, int64_t>> all;
    int runs = 0;
    for (const auto& [id, ranges] : by_thread) {
      all.insert(all.end(), ranges.begin(), ranges.end());
      for (size_t i = 0; i < ranges.size(); ++i) {
        if (i == 0 || ranges[i].first != ranges[i - 1].second) {
          ++runs;  // a share, or a back half taken from another
          continue;
        }
        EXPECT_LE(ranges[i].second - ranges[i].first, ranges[i - 1].second - ranges[i - 1].first);
      }
    }
    EXPECT_LE(runs, 40);
    EXPECT_LE(all.size(), 40u * 30u);
    std::sort(all.begin(), all.end());
    int64_t covered = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_EQ(all[i].first, i == 0 ? 0 : all[i - 1].second);
      covered += all[i].second - all[i].first;
    }
    EXPECT_EQ(covered, 1000);
  }
}

// A thread held up in its first take: the other runs everything else, the rest of the held
// thread's share included. (Were the work not moved, the held take would wait out the deadline.)
TEST(ThreadPoolTest, DynamicMovesWorkAwayFromAHeldThread) {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    constexpr int64_t kN = 400;
    std::mutex mu;
    std::condition_variable cv;
    int64_t done = 0, held = 0;
    bool timed_out = false;
    std::vector<std::atomic<int>> hits(kN);
    pool.ParallelForDynamic(kN, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      std::unique_lock<std::mutex> lock(mu);
      if (b != 0) {
        done += e - b;
        cv.notify_all();
        return;
      }
      held = e - b;
      timed_out = !cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == kN - held; });
    });
    EXPECT_FALSE(timed_out) << threads << " threads: " << done << " of " << kN - held << " done";
    for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  }
}

// Several threads taking from each other's shares at once, with takes of uneven cost.
TEST(ThreadPoolTest, DynamicCoversEveryIndexOnceUnderStealing) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 50; ++rep) {
    const int64_t n = 997 + rep * 13;
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelForDynamic(n, 3, [&](int64_t b, int64_t e) {
      volatile int64_t spin = 0;
      for (int64_t i = b; i < e; ++i) {
        hits[i].fetch_add(1);
        for (int64_t j = 0; j < (i % 7) * 200; ++j) spin = spin + j;
      }
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
  }
}

}  // namespace
}  // namespace tandem
