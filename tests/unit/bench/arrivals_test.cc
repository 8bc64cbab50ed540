#include "bench/serving/arrivals.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace tandem::bench {
namespace {

std::vector<double> Gaps(const std::vector<double>& offsets) {
  std::vector<double> gaps;
  for (size_t i = 1; i < offsets.size(); ++i) gaps.push_back(offsets[i] - offsets[i - 1]);
  return gaps;
}

TEST(LoadgenPoissonScheduleTest, InterArrivalTimesAreExponentialWithMeanOneOverRate) {
  constexpr double kRate = 50;
  std::vector<double> offsets = PoissonSchedule(20001, kRate, 7);
  ASSERT_EQ(offsets.size(), 20001u);
  EXPECT_EQ(offsets[0], 0);
  std::vector<double> gaps = Gaps(offsets);
  double sum = 0, sum_sq = 0;
  int below_median = 0;
  for (double g : gaps) {
    ASSERT_GE(g, 0);
    sum += g;
    sum_sq += g * g;
    if (g < std::log(2.0) / kRate) ++below_median;  // the exponential's median
  }
  const double n = static_cast<double>(gaps.size());
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  // Standard error of the mean is 0.7% of it at n = 20000; 3% is over 4 standard errors.
  EXPECT_NEAR(mean, 1 / kRate, 0.03 / kRate);
  EXPECT_NEAR(stddev / mean, 1.0, 0.05);  // coefficient of variation 1
  EXPECT_NEAR(below_median / n, 0.5, 0.02);
}

TEST(LoadgenPoissonScheduleTest, IsDeterministicForASeed) {
  EXPECT_EQ(PoissonSchedule(100, 10, 42), PoissonSchedule(100, 10, 42));
  EXPECT_NE(PoissonSchedule(100, 10, 42), PoissonSchedule(100, 10, 43));
}

TEST(LoadgenPoissonScheduleTest, InfiniteRateSendsEverythingAtOnce) {
  std::vector<double> offsets = PoissonSchedule(5, std::numeric_limits<double>::infinity(), 1);
  EXPECT_EQ(offsets, std::vector<double>(5, 0.0));
  EXPECT_TRUE(PoissonSchedule(0, 3, 1).empty());
}

TEST(LoadgenPoissonScheduleTest, HigherRateGivesProportionallyShorterRun) {
  std::vector<double> slow = PoissonSchedule(1000, 10, 5);
  std::vector<double> fast = PoissonSchedule(1000, 20, 5);
  // Same seed, same uniforms: every gap halves exactly.
  EXPECT_NEAR(fast.back() * 2, slow.back(), 1e-9 * slow.back());
}

}  // namespace
}  // namespace tandem::bench
