#include "bench/serving/latency_stats.h"

#include <gtest/gtest.h>

namespace tandem::bench {
namespace {

// References computed by hand with numpy's default ("linear") definition:
// rank = p/100 * (n - 1), interpolated between the two closest ranks.
TEST(LoadgenPercentileTest, LinearInterpolationMatchesHandComputedValues) {
  const std::vector<double> v = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 15);
  EXPECT_DOUBLE_EQ(Percentile(v, 40), 29);    // rank 1.6: 20 + 0.6 * 15
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 35);    // rank 2
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 46);    // rank 3.6: 40 + 0.6 * 10
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 49.6);  // rank 3.96: 40 + 0.96 * 10
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 50);
  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(ten, 50), 5.5);   // rank 4.5
  EXPECT_DOUBLE_EQ(Percentile(ten, 90), 9.1);   // rank 8.1
  EXPECT_DOUBLE_EQ(Percentile(ten, 99), 9.91);  // rank 8.91
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
}

TEST(LoadgenSummarizeTest, SortsAndConvertsSecondsToMilliseconds) {
  Distribution d = Summarize(std::vector<double>{0.050, 0.015, 0.040, 0.020, 0.035});
  EXPECT_EQ(d.count, 5);
  EXPECT_NEAR(d.mean_ms, 32, 1e-9);
  EXPECT_NEAR(d.p50_ms, 35, 1e-9);
  EXPECT_NEAR(d.p90_ms, 46, 1e-9);
  EXPECT_NEAR(d.p99_ms, 49.6, 1e-9);
  EXPECT_NEAR(d.max_ms, 50, 1e-9);
  Distribution empty = Summarize(std::vector<double>{});
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.p99_ms, 0);
}

RequestRecord Ok(double send, double ttft, double tpot, int completion_tokens) {
  RequestRecord r;
  r.code = absl::StatusCode::kOk;
  r.got_complete = true;
  r.send_s = r.scheduled_s = send;
  r.first_token_s = send + ttft;
  r.end_s = r.first_token_s + tpot * (completion_tokens - 1);
  r.prompt_tokens = 10;
  r.completion_tokens = completion_tokens;
  return r;
}

RequestRecord Failed(absl::StatusCode code, double send) {
  RequestRecord r;
  r.code = code;
  r.error = "no room";
  r.send_s = r.scheduled_s = send;
  r.end_s = send + 0.001;
  return r;
}

// r0: TTFT 100 ms, TPOT 100 ms; r1: 300 / 50; r2: 50 / 200; r3: failed; r4: 100 ms, one token.
std::vector<RequestRecord> Records() {
  return {Ok(0, 0.1, 0.1, 11), Ok(0.5, 0.3, 0.05, 5), Ok(1, 0.05, 0.2, 3),
          Failed(absl::StatusCode::kResourceExhausted, 1.5), Ok(2, 0.1, 0, 1)};
}

TEST(LoadgenGoodputTest, CountsRequestsMeetingEverySetObjective) {
  const std::vector<RequestRecord> records = Records();
  BenchSummary none = Summarize(records, 4.0, Slo{});
  EXPECT_FALSE(none.goodput.has_value());
  EXPECT_FALSE(none.good_requests.has_value());

  BenchSummary ttft = Summarize(records, 4.0, Slo{.ttft_ms = 200});
  EXPECT_EQ(ttft.good_requests, 3);  // r0, r2, r4
  BenchSummary tpot = Summarize(records, 4.0, Slo{.tpot_ms = 150});
  EXPECT_EQ(tpot.good_requests, 3);  // r0, r1, r4 (no TPOT: meets it)
  BenchSummary both = Summarize(records, 4.0, Slo{.ttft_ms = 200, .tpot_ms = 150});
  EXPECT_EQ(both.good_requests, 2);  // r0, r4
  ASSERT_TRUE(both.goodput.has_value());
  EXPECT_DOUBLE_EQ(*both.goodput, 0.5);
  BenchSummary strict = Summarize(records, 4.0, Slo{.ttft_ms = 10});
  EXPECT_EQ(strict.good_requests, 0);
}

TEST(LoadgenSummaryTest, CountsFailuresByCodeAndThroughputOverCompletedRequests) {
  BenchSummary s = Summarize(Records(), 4.0, Slo{});
  EXPECT_EQ(s.num_requests, 5);
  EXPECT_EQ(s.completed, 4);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.failures_by_code, (std::map<std::string, int64_t>{{"RESOURCE_EXHAUSTED", 1}}));
  EXPECT_EQ(s.first_error, "RESOURCE_EXHAUSTED: no room");
  EXPECT_EQ(s.total_completion_tokens, 11 + 5 + 3 + 1);
  EXPECT_EQ(s.total_prompt_tokens, 40);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 20 / 4.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 60 / 4.0);
  EXPECT_EQ(s.ttft.count, 4);
  EXPECT_EQ(s.tpot.count, 3);  // the one-token request has no TPOT
  EXPECT_NEAR(s.tpot.p50_ms, 100, 1e-9);
  EXPECT_NEAR(s.ttft.max_ms, 300, 1e-9);
  EXPECT_EQ(s.e2e.count, 4);
}

TEST(LoadgenSummaryTest, StreamWithoutCompleteIsNotASuccess) {
  RequestRecord r = Ok(0, 0.1, 0.1, 3);
  r.code = absl::StatusCode::kInternal;
  BenchSummary s = Summarize({r}, 1.0, Slo{.ttft_ms = 1000});
  EXPECT_EQ(s.completed, 0);
  EXPECT_EQ(s.failures_by_code.at("INTERNAL"), 1);
  EXPECT_EQ(s.good_requests, 0);
}

TEST(LoadgenTpotTest, IsDecodeTimeOverTokensAfterTheFirst) {
  std::optional<double> tpot = TpotSeconds(Ok(1, 0.2, 0.025, 9));
  ASSERT_TRUE(tpot.has_value());
  EXPECT_NEAR(*tpot, 0.025, 1e-12);
  EXPECT_FALSE(TpotSeconds(Ok(1, 0.2, 0.025, 1)).has_value());
}

}  // namespace
}  // namespace tandem::bench
