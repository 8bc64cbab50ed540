#include "common/engine/compute_share.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/engine/engine_loop.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/serving.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::engine {
namespace {

// --- The turn order, driven by a simulated clock ----------------------------------------------

// An engine in the simulation: it asks for a turn `gap` after its last step ended, and steps for
// `step` (both drawn per step, in simulated microseconds).
struct SimEngine {
  Phase phase;
  int64_t min_step, max_step;
  int64_t min_gap, max_gap;
  int64_t ready_at = 0;   // when it next asks
  int64_t asked_at = -1;  // when it asked, while waiting
  int turns = 0;
  int64_t max_wait = 0;
};

struct SimResult {
  std::vector<SimEngine> engines;
  int64_t max_prefill_step = 0;  // the longest prefill step that ran
  int64_t decode_waits_over_one_prefill_step = 0;
};

// Runs `engines` on one TurnOrder for `duration` simulated microseconds.
SimResult Simulate(std::vector<SimEngine> engines, int64_t duration, uint32_t seed) {
  std::mt19937 rng(seed);
  auto draw = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  TurnOrder order;
  SimResult result;
  int holder = -1;
  int64_t holder_until = 0, holder_step = 0;
  int64_t now = 0;
  while (now < duration) {
    // Next event: the holder's step ends (first, on a tie), or an idle engine asks.
    int64_t next = holder >= 0 ? holder_until : INT64_MAX;
    for (const SimEngine& e : engines) {
      if (e.asked_at < 0 && static_cast<int>(&e - engines.data()) != holder) {
        next = std::min(next, e.ready_at);
      }
    }
    now = next;
    if (holder >= 0 && holder_until == now) {
      SimEngine& e = engines[holder];
      e.ready_at = now + draw(e.min_gap, e.max_gap);
      if (e.phase == Phase::kPrefill)
        result.max_prefill_step = std::max(result.max_prefill_step, holder_step);
      order.Release();
      holder = -1;
    }
    for (size_t i = 0; i < engines.size(); ++i) {
      SimEngine& e = engines[i];
      if (e.asked_at < 0 && static_cast<int>(i) != holder && e.ready_at <= now) {
        e.asked_at = now;
        order.Want(e.phase, i);
      }
    }
    if (std::optional<uint64_t> granted = order.Grant()) {
      SimEngine& e = engines[*granted];
      const int64_t wait = now - e.asked_at;
      e.max_wait = std::max(e.max_wait, wait);
      e.asked_at = -1;
      ++e.turns;
      holder = static_cast<int>(*granted);
      holder_step = draw(e.min_step, e.max_step);
      holder_until = now + holder_step;
    }
  }
  result.engines = std::move(engines);
  return result;
}

// Two prefill engines with long steps and one decode engine that always has work: a decode step
// waits for at most the one prefill step in progress, never for a second one queued before it,
// yet prefill still gets a step after every decode step.
TEST(TurnOrderTest, DecodeWaitsAtMostOnePrefillStepAndPrefillIsNotStarved) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SimResult r = Simulate({{Phase::kDecode, 800, 1200, 0, 30},
                            {Phase::kPrefill, 2000, 9000, 0, 30},
                            {Phase::kPrefill, 2000, 9000, 0, 30}},
                           2'000'000, seed);
    const SimEngine& decode = r.engines[0];
    EXPECT_LE(decode.max_wait, r.max_prefill_step) << "seed " << seed;
    const int prefill_turns = r.engines[1].turns + r.engines[2].turns;
    // Both sides always want the pool: turns alternate.
    EXPECT_GE(prefill_turns, decode.turns - 1) << "seed " << seed;
    EXPECT_LE(prefill_turns, decode.turns + 1) << "seed " << seed;
  }
}

// A side with nothing to do lends the pool: the other steps back to back without waiting.
TEST(TurnOrderTest, AnIdleSideLendsThePoolBothWays) {
  SimResult prefill_alone = Simulate(
      {{Phase::kDecode, 1000, 1000, 0, 0, 10'000'000}, {Phase::kPrefill, 3000, 5000, 0, 10}},
      1'000'000, 7);
  EXPECT_EQ(prefill_alone.engines[1].max_wait, 0);
  EXPECT_GT(prefill_alone.engines[1].turns, 190);
  SimResult decode_alone = Simulate(
      {{Phase::kDecode, 1000, 2000, 0, 10}, {Phase::kPrefill, 3000, 3000, 0, 0, 10'000'000}},
      1'000'000, 7);
  EXPECT_EQ(decode_alone.engines[0].max_wait, 0);
  EXPECT_GT(decode_alone.engines[0].turns, 490);
}

// Decode and prefill asking at the same moment of an idle pool: decode goes first.
TEST(TurnOrderTest, DecodeFirstOnATie) {
  TurnOrder order;
  order.Want(Phase::kPrefill, 1);
  order.Want(Phase::kDecode, 2);
  EXPECT_EQ(order.Grant(), 2u);
  EXPECT_EQ(order.Grant(), std::nullopt);  // held
  order.Release();
  EXPECT_EQ(order.Grant(), 1u);
  order.Release();
  EXPECT_EQ(order.Grant(), std::nullopt);  // nobody waits
  EXPECT_FALSE(order.held());
}

// --- The shared pool, with threads --------------------------------------------------------------

// Turns exclude each other, and within one the step has every thread of the pool.
TEST(ComputeShareTest, TurnsExcludeEachOtherAndEachHasThePool) {
  ComputeShare share(3);
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> short_handed{0};
  auto engine = [&](Phase phase) {
    for (int i = 0; i < 300; ++i) {
      ComputeShare::Turn turn = share.Acquire(phase);
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
      absl::Mutex mu;
      std::vector<std::thread::id> ids;
      share.pool().ParallelFor(3, 1, [&](int64_t, int64_t) {
        absl::MutexLock lock(&mu);
        ids.push_back(std::this_thread::get_id());
      });
      std::sort(ids.begin(), ids.end());
      if (std::unique(ids.begin(), ids.end()) - ids.begin() != 3) short_handed.fetch_add(1);
      inside.fetch_sub(1);
    }
  };
  std::thread decode(engine, Phase::kDecode);
  std::thread prefill(engine, Phase::kPrefill);
  decode.join();
  prefill.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(short_handed.load(), 0);
  const ComputeShare::Stats stats = share.GetStats();
  EXPECT_EQ(stats.turns[0], 300);
  EXPECT_EQ(stats.turns[1], 300);
  // Idle again, no worker spins: all are asleep.
  EXPECT_TRUE(testing::Eventually([&] { return share.pool().sleeping_workers() == 2; }));
}

// A decode step asking while prefill holds the pool and another prefill step waits goes next.
TEST(ComputeShareTest, AWaitingDecodeStepGoesBeforeAQueuedPrefillStep) {
  ComputeShare share(1);
  absl::Mutex mu;
  std::vector<Phase> order;
  auto step = [&](Phase phase) {
    ComputeShare::Turn turn = share.Acquire(phase);
    absl::MutexLock lock(&mu);
    order.push_back(phase);
  };
  std::optional<ComputeShare::Turn> held;
  held.emplace(share.Acquire(Phase::kPrefill));
  std::thread prefill(step, Phase::kPrefill);
  ASSERT_TRUE(testing::Eventually([&] { return share.Waiting(Phase::kPrefill) == 1; }));
  std::thread decode(step, Phase::kDecode);
  ASSERT_TRUE(testing::Eventually([&] { return share.Waiting(Phase::kDecode) == 1; }));
  held.reset();
  prefill.join();
  decode.join();
  EXPECT_EQ(order, (std::vector<Phase>{Phase::kDecode, Phase::kPrefill}));
  EXPECT_EQ(share.GetStats().waited_turns[0], 1);
  EXPECT_EQ(share.GetStats().waited_turns[1], 1);
}

// The observer hears of every turn with its wait: none for a free pool, some behind a step.
TEST(ComputeShareTest, TheObserverHearsEveryTurnAndItsWait) {
  absl::Mutex mu;
  std::vector<std::pair<Phase, double>> seen;
  ComputeShare share(1, [&](Phase phase, double wait) {
    absl::MutexLock lock(&mu);
    seen.emplace_back(phase, wait);
  });
  std::optional<ComputeShare::Turn> held;
  held.emplace(share.Acquire(Phase::kPrefill));
  std::thread decode([&] { ComputeShare::Turn turn = share.Acquire(Phase::kDecode); });
  ASSERT_TRUE(testing::Eventually([&] { return share.Waiting(Phase::kDecode) == 1; }));
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(20)) {
  }  // the held step computes
  held.reset();
  decode.join();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, Phase::kPrefill);
  EXPECT_EQ(seen[0].second, 0.0);
  EXPECT_EQ(seen[1].first, Phase::kDecode);
  EXPECT_GE(seen[1].second, 0.02);
}

// --- Engines on one shared pool -----------------------------------------------------------------

class SharedEnginesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::WriteTempModel(testing::TinySpec());
    ASSERT_FALSE(dir_.empty());
    auto m = model::Model::Load(dir_, share_.pool());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::unique_ptr<Engine> MakeEngine() {
    EngineOptions o;
    o.kv_dtype = DType::kF32;
    o.num_blocks = 64;
    o.chunk_size = 8;  // several prefill steps per prompt
    auto e = Engine::Create(*model_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  static Request Greedy(const std::string& id, int len, int max_tokens) {
    return testing::GreedyRequest(id, Prompt(len), max_tokens);
  }
  static std::vector<int32_t> Prompt(int len) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back((i * 29 + len) % 128);
    return p;
  }

  ComputeShare share_{2};
  std::string dir_;
  std::unique_ptr<model::Model> model_;
};

// A prefill-phase and a decode-phase engine loop computing on one pool produce what each engine
// produces alone, and the pool saw turns of both phases.
TEST_F(SharedEnginesTest, TwoLoopsOnOnePoolMatchTheEngineAlone) {
  std::map<std::string, std::vector<int32_t>> expected;
  for (int i = 0; i < 6; ++i) {
    const std::string id = absl::StrCat("r", i);
    auto e = MakeEngine();
    expected[id] = testing::RunToCompletion(*e, Greedy(id, 20 + 7 * i, 12)).tokens;
  }
  absl::Mutex mu;
  std::map<std::string, std::vector<int32_t>> got;
  int finished = 0;
  auto collect = [&](const RequestOutput& out, Engine&) {
    absl::MutexLock lock(&mu);
    auto& t = got[out.id];
    t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
    if (out.finish != FinishReason::kNone) ++finished;
  };
  const ComputeShare::Stats before = share_.GetStats();
  {
    EngineLoop prefill(MakeEngine(), &share_, Phase::kPrefill);
    EngineLoop decode(MakeEngine(), &share_, Phase::kDecode);
    for (int i = 0; i < 6; ++i) {
      (i % 2 == 0 ? prefill : decode).Submit(Greedy(absl::StrCat("r", i), 20 + 7 * i, 12), collect);
    }
    absl::MutexLock lock(&mu);
    auto all = [&] {
      mu.AssertHeld();
      return finished == 6;
    };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60)));
  }
  EXPECT_EQ(got, expected);
  const ComputeShare::Stats after = share_.GetStats();
  EXPECT_GT(after.turns[0], before.turns[0]);
  EXPECT_GT(after.turns[1], before.turns[1]);
}

// A task that computes outside a step takes a turn for each piece, like a step: none while
// another engine steps, and the pool is free between pieces.
TEST_F(SharedEnginesTest, ATaskComputesOnATurnPerPiece) {
  EngineLoop loop(MakeEngine(), &share_, Phase::kPrefill);
  std::atomic<int> pieces{0};
  std::atomic<bool> free_between{false};
  absl::Notification done;
  std::optional<ComputeShare::Turn> held;
  held.emplace(share_.Acquire(Phase::kDecode));
  const int64_t turns_before = share_.GetStats().turns[static_cast<int>(Phase::kPrefill)];
  loop.Post([&](Engine&) {
    auto piece = [&] {
      pieces.fetch_add(1);
      return absl::OkStatus();
    };
    EXPECT_TRUE(loop.RunOnTurn(piece).ok());
    free_between.store(!share_.Held());  // between pieces the task holds no turn
    EXPECT_TRUE(loop.RunOnTurn(piece).ok());
    done.Notify();
  });
  ASSERT_TRUE(testing::Eventually([&] { return share_.Waiting(Phase::kPrefill) == 1; }));
  EXPECT_EQ(pieces.load(), 0);  // not while another engine steps
  held.reset();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(pieces.load(), 2);
  EXPECT_TRUE(free_between.load());
  EXPECT_EQ(share_.GetStats().turns[static_cast<int>(Phase::kPrefill)], turns_before + 2);
}

// Loops destroyed while both still have work end every request and return the pool idle.
TEST_F(SharedEnginesTest, ShutdownMidFlightEndsEveryRequest) {
  absl::Mutex mu;
  int finished = 0;
  auto count = [&](const RequestOutput& out, Engine&) {
    if (out.finish == FinishReason::kNone) return;
    absl::MutexLock lock(&mu);
    ++finished;
  };
  {
    EngineLoop prefill(MakeEngine(), &share_, Phase::kPrefill);
    EngineLoop decode(MakeEngine(), &share_, Phase::kDecode);
    // Long enough (440 tokens each, a step per token) to be running when the loops go.
    for (int i = 0; i < 4; ++i) {
      (i % 2 == 0 ? prefill : decode).Submit(Greedy(absl::StrCat("s", i), 40, 400), count);
    }
    ASSERT_TRUE(testing::Eventually([&] {
      const ComputeShare::Stats s = share_.GetStats();
      return s.turns[0] > 2 && s.turns[1] > 2;
    }));
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(finished, 4);
  EXPECT_EQ(share_.Waiting(Phase::kDecode) + share_.Waiting(Phase::kPrefill), 0);
}

}  // namespace
}  // namespace tandem::engine
