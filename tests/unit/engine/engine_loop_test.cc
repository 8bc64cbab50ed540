#include "common/engine/engine_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/serving.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::engine {
namespace {

using ::testing::HasSubstr;

// Collects outputs per request; waits (with a deadline) for requests to finish.
class Collector {
 public:
  EngineLoop::OutputFn Fn() {
    return [this](const RequestOutput& out, Engine&) {
      absl::MutexLock lock(&mu_);
      auto& r = results_[out.id];
      r.tokens.insert(r.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (out.finish != FinishReason::kNone) {
        r.finish = out.finish;
        r.error = out.error;
        ++finished_;
      }
    };
  }
  bool WaitFinished(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [&] {
      mu_.AssertHeld();  // Await evaluates it under mu_
      return finished_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60));
  }
  struct Result {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    absl::Status error;
  };
  Result Get(const std::string& id) {
    absl::MutexLock lock(&mu_);
    return results_[id];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Result> results_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
};

class EngineLoopTest : public testing::TinyModelTest {
 protected:
  Request Greedy(const std::string& id, int len, int max_tokens) {
    Request r;
    r.id = id;
    for (int i = 0; i < len; ++i) r.prompt.push_back((i * 37 + len) % 128);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }
  // The tokens the engine produces for `r` alone, stepped directly.
  std::vector<int32_t> Direct(const Request& r) {
    auto e = MakeEngine();
    return testing::RunToCompletion(*e, r).tokens;
  }
};

TEST_F(EngineLoopTest, RequestsFromSeveralThreadsMatchTheEngineAlone) {
  Collector c;
  EngineLoop loop(MakeEngine());
  std::vector<std::thread> submitters;
  for (int t = 0; t < 4; ++t) {
    submitters.emplace_back(
        [&, t] { loop.Submit(Greedy("r" + std::to_string(t), 5 + 7 * t, 9), c.Fn()); });
  }
  for (auto& th : submitters) th.join();
  ASSERT_TRUE(c.WaitFinished(4));
  for (int t = 0; t < 4; ++t) {
    const auto r = c.Get("r" + std::to_string(t));
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(r.tokens, Direct(Greedy("r" + std::to_string(t), 5 + 7 * t, 9))) << t;
  }
  EXPECT_EQ(loop.GetStats().kv.used_blocks, 0);
}

// The loop's time: every step counted with its batch, CPU within wall time, and the parts that
// are not steps (tasks, output callbacks) apart.
TEST_F(EngineLoopTest, LoopTimeCountsStepsTasksAndOutputs) {
  Collector c;
  EngineLoop loop(MakeEngine());
  EXPECT_EQ(loop.GetStats().time.steps, 0);
  for (int t = 0; t < 2; ++t) loop.Submit(Greedy("r" + std::to_string(t), 6, 9), c.Fn());
  ASSERT_TRUE(c.WaitFinished(2));
  // A task that runs for at least 2 ms of wall time.
  loop.Post([](Engine&) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    while (std::chrono::steady_clock::now() < until) {
    }
  });
  // Published after the iteration that ran it.
  ASSERT_TRUE(testing::Eventually([&] { return loop.GetStats().time.task_seconds >= 0.002; }));
  const EngineLoop::LoopTime t = loop.GetStats().time;
  // Each request is in 9 batches (its prompt in one chunk, then 8 decode steps), alone or
  // beside the other.
  EXPECT_EQ(t.step_sequences, 2 * 9);
  EXPECT_GE(t.steps, 9);
  EXPECT_LE(t.steps, 2 * 9);
  EXPECT_GT(t.step_seconds, 0);
  EXPECT_GT(t.step_cpu_seconds, 0);
  EXPECT_LE(t.step_cpu_seconds, t.step_seconds);
  EXPECT_GT(t.output_seconds, 0);
}

TEST_F(EngineLoopTest, RefusedRequestsEndWithTheirError) {
  Collector c;
  EngineLoop loop(MakeEngine());
  Request bad = Greedy("bad", 3, 0);
  loop.Submit(bad, c.Fn());
  loop.Submit(Greedy("dup", 3, 200), c.Fn());
  loop.Submit(Greedy("dup", 3, 2), c.Fn());
  ASSERT_TRUE(c.WaitFinished(2));
  EXPECT_EQ(c.Get("bad").finish, FinishReason::kError);
  EXPECT_THAT(std::string(c.Get("bad").error.message()), HasSubstr("max_tokens"));
  loop.Abort("dup");
  ASSERT_TRUE(c.WaitFinished(3));
}

TEST_F(EngineLoopTest, AbortFreesEverythingAndTasksSeeTheEngine) {
  Collector c;
  EngineLoop loop(MakeEngine());
  loop.Submit(Greedy("long", 20, 400), c.Fn());
  absl::Notification ran, aborted;
  int64_t total_blocks = 0;
  // The task holds the loop until the abort is queued, so that a loaded machine cannot let
  // the request run to its length first.
  loop.Post([&](Engine& e) {
    total_blocks = e.KvStats().total_blocks;
    ran.Notify();
    EXPECT_TRUE(aborted.WaitForNotificationWithTimeout(absl::Seconds(60)));
  });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(total_blocks, 64);
  loop.Abort("long");
  aborted.Notify();
  ASSERT_TRUE(c.WaitFinished(1));
  EXPECT_EQ(c.Get("long").finish, FinishReason::kAbort);
  absl::Notification idle;
  loop.Post([&](Engine& e) {
    EXPECT_EQ(e.KvStats().used_blocks, 0);
    idle.Notify();
  });
  ASSERT_TRUE(idle.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

TEST_F(EngineLoopTest, ShutdownEndsRequestsInFlight) {
  Collector c;
  {
    EngineLoop loop(MakeEngine());
    loop.Submit(Greedy("a", 10, 400), c.Fn());
    loop.Submit(Greedy("b", 10, 400), c.Fn());
    absl::Notification started;
    loop.Post([&](Engine&) { started.Notify(); });
    ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(60)));
  }
  ASSERT_TRUE(c.WaitFinished(2));
  EXPECT_EQ(c.Get("a").finish, FinishReason::kAbort);
  EXPECT_EQ(c.Get("b").finish, FinishReason::kAbort);
}

}  // namespace
}  // namespace tandem::engine
