#include "bench/serving/bench_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/bench/args.h"

namespace tandem::bench {
namespace {

using testing::BenchArgs;
using ::testing::HasSubstr;

absl::StatusOr<BenchOptions> Parse(std::vector<std::string> words) {
  auto args = BenchArgs(std::move(words));
  if (!args.ok()) return args.status();
  return ParseBenchOptions(*args);
}

TEST(LoadgenOptionsTest, Defaults) {
  auto o = Parse({"--addr", "localhost:8000"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->addr, "localhost:8000");
  EXPECT_EQ(o->num_requests, 1000);
  EXPECT_TRUE(std::isinf(o->request_rate));
  EXPECT_EQ(o->max_concurrency, 0);
  EXPECT_EQ(o->input_len, 1024);
  EXPECT_EQ(o->output_len, 128);
  EXPECT_FALSE(o->vocab_size.has_value());
  EXPECT_EQ(o->timeout_s, 600);
  EXPECT_FALSE(o->slo.any());
  EXPECT_EQ(o->progress, ProgressMode::kAuto);
  EXPECT_EQ(o->connections, 4);
}

TEST(LoadgenOptionsTest, ParsesEveryFlag) {
  auto o = Parse({"--addr=[::1]:9",
                  "--num-requests",
                  "10",
                  "--request-rate",
                  "2.5",
                  "--max-concurrency",
                  "3",
                  "--seed",
                  "9",
                  "--input-len",
                  "32",
                  "--input-len-range",
                  "0.25",
                  "--output-len",
                  "4",
                  "--output-len-range",
                  "0.5",
                  "--vocab-size",
                  "77",
                  "--timeout-seconds",
                  "1.5",
                  "--slo-ttft-ms",
                  "200",
                  "--slo-tpot-ms",
                  "20",
                  "--json-out",
                  "/tmp/x.json",
                  "--progress",
                  "--connections",
                  "2"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->num_requests, 10);
  EXPECT_EQ(o->request_rate, 2.5);
  EXPECT_EQ(o->max_concurrency, 3);
  EXPECT_EQ(o->seed, 9u);
  EXPECT_EQ(o->input_len, 32);
  EXPECT_EQ(o->input_len_range, 0.25);
  EXPECT_EQ(o->output_len, 4);
  EXPECT_EQ(o->output_len_range, 0.5);
  EXPECT_EQ(o->vocab_size, 77);
  EXPECT_EQ(o->timeout_s, 1.5);
  EXPECT_EQ(o->slo.ttft_ms, 200);
  EXPECT_EQ(o->slo.tpot_ms, 20);
  EXPECT_EQ(o->json_out, "/tmp/x.json");
  EXPECT_EQ(o->progress, ProgressMode::kOn);
  EXPECT_EQ(o->connections, 2);
  EXPECT_EQ(Parse({"--addr", "h:1", "--progress=false"})->progress, ProgressMode::kOff);
  EXPECT_TRUE(std::isinf(Parse({"--addr", "h:1", "--request-rate", "INF"})->request_rate));
}

// Every bad value is InvalidArgument naming its flag.
TEST(LoadgenOptionsTest, RejectsBadValuesNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "--addr is required"},
      {{"--addr", "localhost"}, "--addr must be HOST:PORT"},
      {{"--addr", "h:0"}, "--addr must be HOST:PORT"},
      {{"--addr", "h:1", "--bogus", "1"}, "unknown flag --bogus"},
      {{"--addr", "h:1", "--num-requests", "0"}, "--num-requests must be in"},
      {{"--addr", "h:1", "--num-requests", "ten"}, "--num-requests must be an integer"},
      {{"--addr", "h:1", "--request-rate", "0"}, "--request-rate must be a number > 0"},
      {{"--addr", "h:1", "--request-rate", "fast"}, "--request-rate must be a number > 0"},
      {{"--addr", "h:1", "--max-concurrency", "-1"}, "--max-concurrency must be in"},
      {{"--addr", "h:1", "--seed", "-3"}, "--seed must be in"},
      {{"--addr", "h:1", "--input-len", "0"}, "--input-len must be in"},
      {{"--addr", "h:1", "--input-len-range", "1"}, "--input-len-range must be in [0, 1)"},
      {{"--addr", "h:1", "--output-len-range", "-0.1"}, "--output-len-range must be >= 0"},
      {{"--addr", "h:1", "--vocab-size", "0"}, "--vocab-size must be in"},
      {{"--addr", "h:1", "--timeout-seconds", "0"}, "--timeout-seconds must be > 0"},
      {{"--addr", "h:1", "--slo-ttft-ms", "-5"}, "--slo-ttft-ms must be > 0"},
      {{"--addr", "h:1", "--slo-tpot-ms", "x"}, "--slo-tpot-ms must be a number"},
      {{"--addr", "h:1", "--json-out="}, "--json-out must name a file"},
      {{"--addr", "h:1", "--progress=maybe"}, "--progress takes no value or true/false"},
      {{"--addr", "h:1", "--connections", "0"}, "--connections must be in"},
      {{"--addr", "h:1", "--dataset", "d.jsonl", "--input-len", "5"},
       "--input-len applies to random prompts"},
      {{"--addr", "h:1", "--dataset", "d.jsonl", "--output-len-range", "0.5"},
       "--output-len-range applies to random prompts"},
  };
  for (const auto& [words, expected] : cases) {
    auto o = Parse(words);
    ASSERT_FALSE(o.ok()) << expected;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_THAT(o.status().message(), HasSubstr(expected));
  }
}

TEST(LoadgenOptionsTest, DatasetLeavesTheRequestCountToTheFileUnlessGiven) {
  auto o = Parse({"--addr", "h:1", "--dataset", "d.jsonl"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->dataset, "d.jsonl");
  EXPECT_FALSE(o->num_requests_set);
  EXPECT_TRUE(Parse({"--addr", "h:1", "--dataset", "d", "--num-requests", "5"})->num_requests_set);
}

}  // namespace
}  // namespace tandem::bench
