#include "router/planner_advisor.h"

#include <cmath>
#include <string>

#include "common/util/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/manual_time.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;
using Clock = WorkloadStats::Clock;

// Arrivals at `rate` over `seconds`, alternating prompts of prompt ± spread and outputs of
// output ± spread tokens, each finishing as it arrives.
void Drive(WorkloadStats& stats, testing::ManualTimeSource& clock, double rate, double seconds,
           int prompt, int output, int spread) {
  const int n = static_cast<int>(std::lround(rate * seconds));
  for (int i = 0; i < n; ++i) {
    const int sign = i % 2 == 0 ? 1 : -1;
    stats.RecordArrival(prompt + sign * spread, clock.Now());
    stats.RecordFinish(output + sign * spread, 0.2, 0.02, clock.Now());
    clock.Advance(std::chrono::duration<double>(1.0 / rate));
  }
}

TEST(WorkloadStatsTest, MeasuresRateLengthsAndLatencies) {
  testing::ManualTimeSource clock;
  WorkloadStats stats(std::chrono::seconds(60));
  EXPECT_EQ(stats.Take(clock.Now()).arrival_rate, 0);  // nothing yet
  Drive(stats, clock, 4, 30, 100, 20, 10);
  const WorkloadStats::Snapshot s = stats.Take(clock.Now());
  EXPECT_NEAR(s.window_s, 30, 1e-9);
  EXPECT_NEAR(s.arrival_rate, 4, 1e-9);
  EXPECT_EQ(s.prompt_tokens.count, 120);
  EXPECT_NEAR(s.prompt_tokens.mean, 100, 1e-9);
  EXPECT_NEAR(s.prompt_tokens.stddev, 10, 1e-9);
  EXPECT_NEAR(s.output_tokens.mean, 20, 1e-9);
  EXPECT_NEAR(s.ttft_s.mean, 0.2, 1e-9);
  EXPECT_NEAR(s.tpot_s.mean, 0.02, 1e-9);
}

// Samples older than the window leave it: the figures follow the traffic.
TEST(WorkloadStatsTest, OldSamplesExpire) {
  testing::ManualTimeSource clock;
  WorkloadStats stats(std::chrono::seconds(60));
  Drive(stats, clock, 10, 60, 1000, 10, 0);
  Drive(stats, clock, 2, 90, 50, 300, 0);
  const WorkloadStats::Snapshot s = stats.Take(clock.Now());
  EXPECT_NEAR(s.window_s, 60, 1e-9);
  EXPECT_NEAR(s.prompt_tokens.mean, 50, 1e-9);
  EXPECT_NEAR(s.output_tokens.mean, 300, 1e-9);
  EXPECT_NEAR(s.arrival_rate, 2, 0.1);
  clock.Advance(std::chrono::minutes(5));  // quiet
  const WorkloadStats::Snapshot quiet = stats.Take(clock.Now());
  EXPECT_EQ(quiet.arrival_rate, 0);
  EXPECT_EQ(quiet.prompt_tokens.count, 0);
}

TEST(PlannerAdvisorTest, PlansForUniformLengthsWithTheMeasuredSpread) {
  WorkloadStats::Snapshot s;
  s.prompt_tokens = {.count = 10, .mean = 1000, .stddev = 100};
  s.output_tokens = {.count = 10, .mean = 50, .stddev = 0};
  planner::Workload slo;
  slo.slo_ttft_s = 1;
  const planner::Workload w = PlannerAdvisor::WorkloadOf(s, slo);
  EXPECT_EQ(w.input_len, 1000);
  EXPECT_NEAR(w.input_len_range, std::sqrt(3.0) * 0.1, 1e-12);
  EXPECT_EQ(w.output_len, 50);
  EXPECT_EQ(w.output_len_range, 0);
  EXPECT_EQ(w.slo_ttft_s, 1);
}

PlannerAdvisorOptions Options125m() {
  PlannerAdvisorOptions o;
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/bench/profiles/125m-bf16-1t.json";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<planner::EngineProfile> p = planner::EngineProfile::FromJson(*text, path);
  EXPECT_TRUE(p.ok()) << p.status();
  o.profile = *p;
  o.slo.slo_ttft_s = 2;
  o.slo.slo_tpot_s = 0.05;
  o.slo.num_requests = 300;
  o.recommend.engine.max_num_seqs = 64;
  o.recommend.engine.num_blocks = (int64_t{4} << 30) / (p->kv_bytes_per_token * p->block_size);
  o.recommend.prefill = o.recommend.engine;
  o.recommend.headroom = 1;
  o.min_requests = 50;
  return o;
}

// The simulated workload shift: the router's traffic moves from decode-heavy to prefill-heavy
// at the same rate, and the exported recommendation moves from mostly decode replicas to mostly
// prefill replicas (what docs/architecture.md describes: the planner's slow, global reaction).
TEST(PlannerAdvisorTest, AWorkloadShiftMovesTheExportedSplit) {
  testing::ManualTimeSource clock;
  WorkloadStats stats(std::chrono::seconds(120));
  metrics::Metrics registry;
  PlannerAdvisor advisor(Options125m(), stats, &registry.planner(), clock);

  Drive(stats, clock, 8, 5, 64, 256, 16);  // 40 requests: too few to plan for
  absl::StatusOr<PlannerAdvisor::Round> early = advisor.Update();
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_FALSE(early->recommendation.has_value());
  EXPECT_THAT(registry.Serialize(),
              HasSubstr("tandem_planner_recommended_replicas{role=\"prefill\"} 1"));

  Drive(stats, clock, 8, 115, 64, 256, 16);
  absl::StatusOr<PlannerAdvisor::Round> decode_heavy = advisor.Update();
  ASSERT_TRUE(decode_heavy.ok()) << decode_heavy.status();
  ASSERT_TRUE(decode_heavy->recommendation.has_value());
  const planner::Recommendation& before = *decode_heavy->recommendation;
  EXPECT_TRUE(before.feasible);
  EXPECT_LT(before.prefill_replicas, before.decode_replicas);
  EXPECT_THAT(registry.Serialize(),
              HasSubstr("tandem_planner_recommended_replicas{role=\"decode\"} " +
                        std::to_string(before.decode_replicas)));

  Drive(stats, clock, 8, 120, 1536, 32, 256);  // the whole window is prefill-heavy now
  absl::StatusOr<PlannerAdvisor::Round> prefill_heavy = advisor.Update();
  ASSERT_TRUE(prefill_heavy.ok()) << prefill_heavy.status();
  ASSERT_TRUE(prefill_heavy->recommendation.has_value());
  const planner::Recommendation& after = *prefill_heavy->recommendation;
  EXPECT_NEAR(prefill_heavy->measured.prompt_tokens.mean, 1536, 1e-6);
  EXPECT_GT(after.prefill_replicas, after.decode_replicas);
  const std::string text = registry.Serialize();
  EXPECT_THAT(text, HasSubstr("tandem_planner_recommended_replicas{role=\"prefill\"} " +
                              std::to_string(after.prefill_replicas)));
  EXPECT_THAT(text, HasSubstr("tandem_planner_feasible 1"));
  EXPECT_THAT(text, HasSubstr("tandem_planner_mean_tokens{kind=\"prompt\"} 1536"));
}

// The bundled model's profile carries the CPU of the router, store shard and client measured
// on the replicas' cores (bench/serving/validate_planner.py --calibrate). The advisor charges it
// only where the stack shares those cores (planner.shared_stack_cpu); by default (its own
// machines or pods) it plans as if the profile's shared costs were zero.
TEST(PlannerAdvisorTest, SharedStackCpuIsChargedOnlyWhereTheStackSharesTheCores) {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/bench/profiles/tandem-py-8l-1t.json";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<planner::EngineProfile> profile = planner::EngineProfile::FromJson(*text, path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_GT(profile->shared_overhead_seconds, 0);
  ASSERT_GT(profile->shared_step_overhead_seconds, 0);

  PlannerAdvisorOptions o = Options125m();
  o.profile = *profile;
  o.slo.slo_ttft_s = 0.25;
  o.slo.slo_tpot_s = 0.01;
  o.recommend.engine.num_blocks =
      (int64_t{1} << 30) / (profile->kv_bytes_per_token * profile->block_size);
  o.recommend.prefill = o.recommend.engine;
  // The advisor's round at 24 req/s of the decode-heavy workload, and Recommend run directly
  // on what that round measured with `planned` as the profile: the two must agree exactly.
  auto check = [&](bool shared_stack_cpu, const planner::EngineProfile& planned) {
    o.shared_stack_cpu = shared_stack_cpu;
    testing::ManualTimeSource clock;
    WorkloadStats stats(std::chrono::seconds(60));
    PlannerAdvisor advisor(o, stats, nullptr, clock);
    Drive(stats, clock, 24, 60, 512, 128, 64);
    absl::StatusOr<PlannerAdvisor::Round> r = advisor.Update();
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->recommendation.has_value());
    absl::StatusOr<planner::Recommendation> want =
        planner::Recommend(planned, PlannerAdvisor::WorkloadOf(r->measured, o.slo),
                           r->measured.arrival_rate, o.recommend);
    EXPECT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(r->recommendation->prefill_replicas, want->prefill_replicas);
    EXPECT_EQ(r->recommendation->decode_replicas, want->decode_replicas);
    EXPECT_EQ(r->recommendation->at_target.tpot.p90, want->at_target.tpot.p90);
    return *r->recommendation;
  };
  planner::EngineProfile zeroed = *profile;
  zeroed.shared_overhead_seconds = zeroed.shared_step_overhead_seconds = 0;
  const planner::Recommendation separate = check(false, zeroed);
  const planner::Recommendation shared = check(true, *profile);
  // And the shared stack's CPU makes the plan more expensive, not the same.
  EXPECT_TRUE(shared.prefill_replicas + shared.decode_replicas >
                  separate.prefill_replicas + separate.decode_replicas ||
              shared.at_target.tpot.p90 > separate.at_target.tpot.p90);
}

// A workload the profile cannot serve (a prompt beyond every replica's KV budget) is an error
// for the round, not a crash (the thread logs it and goes on).
TEST(PlannerAdvisorTest, AnUnservableWorkloadIsAnError) {
  testing::ManualTimeSource clock;
  WorkloadStats stats(std::chrono::seconds(120));
  PlannerAdvisorOptions o = Options125m();
  o.recommend.engine.num_blocks = o.recommend.prefill.num_blocks = 4;
  PlannerAdvisor advisor(o, stats, nullptr, clock);
  Drive(stats, clock, 8, 60, 1536, 32, 0);
  absl::StatusOr<PlannerAdvisor::Round> r = advisor.Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

// The thread waits out its interval on a notification: destroying the advisor stops it at
// once, not an hour later (ctest's timeout would fail this test).
TEST(PlannerAdvisorTest, DestructionStopsTheThreadAtOnce) {
  testing::ManualTimeSource clock;
  WorkloadStats stats;
  PlannerAdvisorOptions o = Options125m();
  o.interval = std::chrono::hours(1);
  const auto start = Clock::now();
  {
    PlannerAdvisor advisor(o, stats, nullptr, clock);
    advisor.Start();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace tandem::router
