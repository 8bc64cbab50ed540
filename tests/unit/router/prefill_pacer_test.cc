// The pacer alone, driven step by step: what waits, what starts, and the ledger, for cancels
// while queued, releases after the balancer disengages, retries and random interleavings. Then
// the same from many threads at once (a ThreadSanitizer target).
#include "router/prefill_pacer.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>
#include <vector>

namespace tandem::router {
namespace {

constexpr int64_t kBlock = 1000;

// Records which keys' starts ran, in order.
class PacerTest : public ::testing::Test {
 protected:
  PrefillPacer::Start StartOf(uint64_t key) {
    return [this, key] { started_.push_back(key); };
  }
  void Schedule(uint64_t key, int64_t bytes, bool engaged, bool high_priority = false) {
    PrefillPacer::Runnable run;
    pacer_.Schedule(key, bytes, high_priority, engaged, StartOf(key), &run);
    for (auto& s : run) s();
  }
  void Release(uint64_t key, bool engaged) {
    PrefillPacer::Runnable run;
    pacer_.Release(key, engaged, &run);
    for (auto& s : run) s();
  }
  void Poll(bool engaged) {
    PrefillPacer::Runnable run;
    pacer_.Poll(engaged, &run);
    for (auto& s : run) s();
  }

  PrefillPacer pacer_{3 * kBlock};
  std::vector<uint64_t> started_;
};

TEST_F(PacerTest, WhileDisengagedNothingWaits) {
  for (uint64_t k = 1; k <= 5; ++k) Schedule(k, 2 * kBlock, /*engaged=*/false);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(pacer_.ahead_bytes(), 10 * kBlock);
  for (uint64_t k = 1; k <= 5; ++k) Release(k, false);
  EXPECT_EQ(pacer_.ahead_bytes(), 0);
}

TEST_F(PacerTest, WhileEngagedPrefillsWaitForRoomInOrder) {
  Schedule(1, 2 * kBlock, true);  // nothing ahead: runs, even past the limit
  Schedule(2, 2 * kBlock, true);  // 4 > 3: waits
  Schedule(3, 1 * kBlock, true);  // would fit, but 2 is first
  EXPECT_EQ(started_, (std::vector<uint64_t>{1}));
  EXPECT_EQ(pacer_.queued(), 2);
  Release(1, true);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(pacer_.ahead_bytes(), 3 * kBlock);
  EXPECT_EQ(pacer_.queued(), 0);
}

TEST_F(PacerTest, ACancelWhileQueuedLeavesTheLedgerAlone) {
  Schedule(1, 2 * kBlock, true);
  Schedule(2, 2 * kBlock, true);
  Schedule(3, 2 * kBlock, true);
  Release(2, true);  // cancelled while waiting: its bytes were never counted
  EXPECT_EQ(pacer_.ahead_bytes(), 2 * kBlock);
  EXPECT_EQ(pacer_.queued(), 1);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1}));
  Release(1, true);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1, 3}));  // 2 never starts
  Release(3, true);
  Release(2, true);  // twice: harmless
  EXPECT_EQ(pacer_.ahead_bytes(), 0);
  EXPECT_EQ(pacer_.queued(), 0);
}

// The wedge of issue 17: a queued call cancelled after the balancer disengaged used to be
// handed back to itself (and started under its own lock). It leaves; the others start.
TEST_F(PacerTest, AReleaseAfterDisengagingStartsOthersNeverItself) {
  Schedule(1, 2 * kBlock, true);
  Schedule(2, 2 * kBlock, true);
  Schedule(3, 2 * kBlock, true);
  Release(2, /*engaged=*/false);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(pacer_.ahead_bytes(), 4 * kBlock);
  Release(1, false);
  Release(3, false);
  EXPECT_EQ(pacer_.ahead_bytes(), 0);
}

TEST_F(PacerTest, PollStartsQueuedPrefillsOnceDisengaged) {
  Schedule(1, 2 * kBlock, true);
  Schedule(2, 2 * kBlock, true);
  Poll(true);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1}));
  Poll(false);
  EXPECT_EQ(started_, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(pacer_.queued(), 0);
}

TEST_F(PacerTest, HighPriorityAndRetriesNeverWait) {
  Schedule(1, 3 * kBlock, true);
  Schedule(2, 2 * kBlock, true, /*high_priority=*/true);  // a re-prefill after misses
  Schedule(1, 0, true);                                   // 1 retried on another worker
  EXPECT_EQ(started_, (std::vector<uint64_t>{1, 2, 1}));
  EXPECT_EQ(pacer_.ahead_bytes(), 5 * kBlock);
  Release(1, true);
  Release(2, true);
  EXPECT_EQ(pacer_.ahead_bytes(), 0);
}

TEST_F(PacerTest, NoLimitPacesNothing) {
  PrefillPacer unlimited(0);
  int runs = 0;
  for (uint64_t k = 1; k <= 3; ++k) {
    PrefillPacer::Runnable run;
    unlimited.Schedule(
        k, 100 * kBlock, false, true, [&] { ++runs; }, &run);
    for (auto& s : run) s();
  }
  EXPECT_EQ(runs, 3);
}

// Random schedules, releases and balancer flips against a model of what must hold: every start
// runs once, only for a live key; the ledger is the sum of started, unreleased keys' bytes; and
// nothing is left once every key is released.
TEST_F(PacerTest, RandomInterleavingsKeepTheLedgerExact) {
  for (int seed = 1; seed <= 20; ++seed) {
    PrefillPacer pacer(5 * kBlock);
    std::mt19937 rng(seed);
    std::map<uint64_t, int64_t> live;  // key -> bytes
    std::map<uint64_t, bool> started;
    std::vector<uint64_t> order;
    auto run_all = [&](PrefillPacer::Runnable& run) {
      for (auto& s : run) s();
    };
    uint64_t next = 1;
    for (int step = 0; step < 400; ++step) {
      const bool engaged = rng() % 4 != 0;
      PrefillPacer::Runnable run;
      if (live.empty() || rng() % 2 == 0) {
        const uint64_t key = next++;
        const int64_t bytes = (1 + rng() % 3) * kBlock;
        live[key] = bytes;
        started[key] = false;
        pacer.Schedule(
            key, bytes, rng() % 10 == 0, engaged,
            [&, key] {
              ASSERT_TRUE(live.contains(key)) << "started after release: " << key;
              ASSERT_FALSE(started[key]) << "started twice: " << key;
              started[key] = true;
            },
            &run);
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        const uint64_t key = it->first;
        live.erase(it);
        pacer.Release(key, engaged, &run);
      }
      run_all(run);
      int64_t expected = 0;
      for (const auto& [key, bytes] : live) expected += started[key] ? bytes : 0;
      ASSERT_EQ(pacer.ahead_bytes(), expected) << "seed " << seed << " step " << step;
    }
    while (!live.empty()) {
      PrefillPacer::Runnable run;
      const uint64_t key = live.begin()->first;
      live.erase(live.begin());
      pacer.Release(key, true, &run);
      run_all(run);
    }
    EXPECT_EQ(pacer.ahead_bytes(), 0) << seed;
    EXPECT_EQ(pacer.queued(), 0) << seed;
  }
}

// Threads schedule and release their own keys at once; the ledger ends at 0.
TEST(PrefillPacerThreadsTest, ConcurrentCallersEndWithAnEmptyLedger) {
  PrefillPacer pacer(4 * kBlock);
  constexpr int kThreads = 4, kPerThread = 300;
  std::atomic<int> starts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t key = static_cast<uint64_t>(t) * kPerThread + i + 1;
        PrefillPacer::Runnable run;
        pacer.Schedule(
            key, kBlock, false, i % 3 != 0, [&] { ++starts; }, &run);
        for (auto& s : run) s();
        run.clear();
        pacer.Release(key, i % 3 != 0, &run);
        for (auto& s : run) s();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pacer.ahead_bytes(), 0);
  EXPECT_EQ(pacer.queued(), 0);
  // Every prefill scheduled while disengaged (one in three) starts at once.
  EXPECT_GE(starts.load(), kThreads * kPerThread / 3);
}

}  // namespace
}  // namespace tandem::router
