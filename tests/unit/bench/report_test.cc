#include "bench/serving/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "bench/serving/progress_bar.h"

namespace tandem::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

BenchSummary Sample() {
  BenchSummary s;
  s.num_requests = 10;
  s.completed = 8;
  s.failed = 2;
  s.failures_by_code = {{"RESOURCE_EXHAUSTED", 2}};
  s.first_error = "RESOURCE_EXHAUSTED: queue full";
  s.duration_s = 4;
  s.total_prompt_tokens = 80;
  s.total_completion_tokens = 40;
  s.request_throughput = 2;
  s.output_throughput = 10;
  s.total_token_throughput = 30;
  s.ttft = {.count = 8, .mean_ms = 12.5, .p50_ms = 11, .p90_ms = 20, .p99_ms = 24, .max_ms = 25};
  return s;
}

TEST(LoadgenReportTest, TableShowsFailuresByCodeAndLatencies) {
  RunDescription run{.addr = "h:1", .model = "m", .request_rate = 5};
  std::string table = FormatTable(Sample(), run);
  EXPECT_THAT(table, HasSubstr("Successful requests:"));
  EXPECT_THAT(table, HasSubstr("Failed requests:"));
  EXPECT_THAT(table, HasSubstr("RESOURCE_EXHAUSTED:"));
  EXPECT_THAT(table, HasSubstr("Median TTFT (ms):"));
  EXPECT_THAT(table, HasSubstr("11.00"));
  EXPECT_THAT(table, HasSubstr("P99 ITL (ms):"));
  EXPECT_THAT(table, HasSubstr("First failure: RESOURCE_EXHAUSTED: queue full"));
  EXPECT_THAT(table, Not(HasSubstr("goodput")));
}

TEST(LoadgenReportTest, JsonCarriesTheSummaryAndGoodputOnlyWithAnSlo) {
  RunDescription run{
      .addr = "h:1", .dataset = "random", .request_rate = std::numeric_limits<double>::infinity()};
  nlohmann::json j = ToJson(Sample(), run);
  EXPECT_EQ(j["completed"], 8);
  EXPECT_EQ(j["failed"], 2);
  EXPECT_EQ(j["failures_by_code"]["RESOURCE_EXHAUSTED"], 2);
  EXPECT_EQ(j["total_output_tokens"], 40);
  EXPECT_EQ(j["ttft_ms"]["p50"], 11.0);
  EXPECT_EQ(j["config"]["request_rate"], "inf");
  EXPECT_FALSE(j.contains("goodput"));

  BenchSummary with_slo = Sample();
  with_slo.good_requests = 6;
  with_slo.goodput = 1.5;
  run.slo.ttft_ms = 100;
  nlohmann::json g = ToJson(with_slo, run);
  EXPECT_EQ(g["goodput"], 1.5);
  EXPECT_EQ(g["good_requests"], 6);
  EXPECT_EQ(g["config"]["slo_ttft_ms"], 100.0);
  EXPECT_THAT(FormatTable(with_slo, run), HasSubstr("Request goodput (req/s):"));
}

TEST(LoadgenProgressTest, RendersCountsAndAProportionalBar) {
  Progress p{.total = 100, .sent = 60, .done = 50, .failed = 3, .in_flight = 10, .elapsed_s = 2};
  EXPECT_EQ(RenderProgress(p, 10), "[#####.....]  50/100 done, 3 failed, 10 in flight, 2.0 s");
}

}  // namespace
}  // namespace tandem::bench
