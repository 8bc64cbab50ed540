// The 90% rule with a driven clock: engage below the threshold once a window has enough
// lookups, stay engaged until a whole window since engaging is at threshold + hysteresis.
#include "router/balancer.h"

#include <gtest/gtest.h>

namespace tandem::router {
namespace {

using std::chrono::seconds;

class BalancerTest : public ::testing::Test {
 protected:
  BalancerOptions Options() {
    BalancerOptions o;
    o.window = seconds(10);
    o.min_lookups = 50;
    return o;
  }
  Balancer::Clock::time_point t0_ = Balancer::Clock::now();
};

TEST_F(BalancerTest, FewLookupsDecideNothing) {
  Balancer b(Options(), nullptr);
  b.RecordLookups(0, 49, t0_);
  EXPECT_FALSE(b.HitRate(t0_).has_value());
  EXPECT_FALSE(b.engaged(t0_));
  b.RecordLookups(0, 1, t0_);
  EXPECT_DOUBLE_EQ(*b.HitRate(t0_), 0.0);
  EXPECT_TRUE(b.engaged(t0_));
}

TEST_F(BalancerTest, EngagesBelowThresholdOnly) {
  Balancer b(Options(), nullptr);
  b.RecordLookups(90, 10, t0_);  // exactly 0.90: not below
  EXPECT_FALSE(b.engaged(t0_));
  b.RecordLookups(0, 1, t0_ + seconds(1));
  EXPECT_NEAR(*b.HitRate(t0_ + seconds(1)), 90.0 / 101, 1e-12);
  EXPECT_TRUE(b.engaged(t0_ + seconds(1)));
}

TEST_F(BalancerTest, DisengagesAfterAFullGoodWindowWithHysteresis) {
  Balancer b(Options(), nullptr);
  b.RecordLookups(50, 50, t0_);
  ASSERT_TRUE(b.engaged(t0_));
  // 0.92 is above the threshold but below threshold + hysteresis (0.93): stays engaged.
  b.RecordLookups(92, 8, t0_ + seconds(11));
  EXPECT_TRUE(b.engaged(t0_ + seconds(11)));
  // A window at 0.95, but not yet a whole window since engaging... it is (11 s > 10 s).
  b.RecordLookups(95 * 3, 5 * 3, t0_ + seconds(22));
  EXPECT_FALSE(b.engaged(t0_ + seconds(22)));
}

TEST_F(BalancerTest, AGoodRateRightAfterEngagingDoesNotDisengage) {
  Balancer b(Options(), nullptr);
  b.RecordLookups(10, 50, t0_);
  ASSERT_TRUE(b.engaged(t0_));
  // Many hits a moment later lift the windowed rate to 0.99, but a window has not passed.
  b.RecordLookups(6000, 0, t0_ + seconds(1));
  EXPECT_TRUE(b.engaged(t0_ + seconds(1)));
  EXPECT_FALSE(b.engaged(t0_ + seconds(10) + std::chrono::milliseconds(500)));
}

TEST_F(BalancerTest, OldLookupsLeaveTheWindow) {
  Balancer b(Options(), nullptr);
  b.RecordLookups(0, 100, t0_);
  EXPECT_TRUE(b.HitRate(t0_).has_value());
  EXPECT_FALSE(b.HitRate(t0_ + seconds(11)).has_value());
  b.RecordReschedule();
  b.RecordReschedule();
  EXPECT_EQ(b.reschedules(), 2);
}

TEST_F(BalancerTest, ExportsItsStateAsMetrics) {
  metrics::Metrics m;
  Balancer b(Options(), &m.balancer());
  b.RecordLookups(40, 60, t0_);
  b.RecordReschedule();
  b.PublishRecommendedRatio(2, 2, t0_);
  const std::string text = m.Serialize();
  EXPECT_NE(text.find("tandem_balancer_state 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_decode_kv_hit_ratio 0.4"), std::string::npos);
  EXPECT_NE(text.find("tandem_balancer_reschedules_total 1"), std::string::npos);
}

}  // namespace
}  // namespace tandem::router
