#include "router/stream_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "tests/unit/testing/eventually.h"

namespace tandem::router {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A stream stalled since `since` (never, when unset).
class FakeStream final : public WatchedStream {
 public:
  bool CancelIfStalled(Clock::time_point now, Clock::duration timeout) override {
    ++looks;
    if (!stalled || now - since <= timeout || cancelled) return false;
    cancelled = true;
    return true;
  }
  std::atomic<bool> stalled{false};
  Clock::time_point since = Clock::now();
  std::atomic<bool> cancelled{false};
  std::atomic<int> looks{0};
};

TEST(StreamWatchdogTest, CancelsOnlyStreamsStalledPastTheTimeout) {
  StreamWatchdog watchdog(std::chrono::hours(1));  // its own thread stays out of the way
  auto reading = std::make_shared<FakeStream>();
  auto stalled = std::make_shared<FakeStream>();
  stalled->stalled = true;
  watchdog.Watch(reading);
  watchdog.Watch(stalled);
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(watchdog.Sweep(now + std::chrono::minutes(59)), 0);
  EXPECT_EQ(watchdog.Sweep(now + std::chrono::minutes(61)), 1);
  EXPECT_TRUE(stalled->cancelled);
  EXPECT_FALSE(reading->cancelled);
  // A stream that is gone is dropped (the watchdog held it weakly); the others stay watched.
  std::weak_ptr<FakeStream> gone = reading;
  reading.reset();
  EXPECT_TRUE(gone.expired());
  const int looks = stalled->looks;
  watchdog.Sweep(now);
  EXPECT_EQ(stalled->looks, looks + 1);
}

TEST(StreamWatchdogTest, ItsThreadSweepsAFewTimesPerTimeout) {
  StreamWatchdog watchdog(milliseconds(100));
  auto stalled = std::make_shared<FakeStream>();
  stalled->stalled = true;
  watchdog.Watch(stalled);
  EXPECT_TRUE(testing::Eventually([&] { return stalled->cancelled.load(); },
                                  std::chrono::seconds(5)));
  EXPECT_GE(Clock::now() - stalled->since, milliseconds(100));
}

TEST(StreamWatchdogTest, ZeroTurnsItOff) {
  StreamWatchdog watchdog(Clock::duration::zero());
  auto stalled = std::make_shared<FakeStream>();
  stalled->stalled = true;
  watchdog.Watch(stalled);
  EXPECT_EQ(watchdog.Sweep(Clock::now() + std::chrono::hours(1)), 0);
  EXPECT_EQ(stalled->looks, 0);
}

}  // namespace
}  // namespace tandem::router
