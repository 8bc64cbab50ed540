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
// output ± spread tokens, each finishing as it arrives with the given TTFT and TPOT.
void Drive(WorkloadStats& stats, testing::ManualTimeSource& clock, double rate, double seconds,
           int prompt, int output, int spread, double ttft_s = 0.2, double tpot_s = 0.02) {
  const int n = static_cast<int>(std::lround(rate * seconds));
  for (int i = 0; i < n; ++i) {
    const int sign = i % 2 == 0 ? 1 : -1;
    stats.RecordArrival(prompt + sign * spread, clock.Now());
    stats.RecordFinish(output + sign * spread, ttft_s, tpot_s, clock.Now());
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

// The live deployment of the correction tests: one prefill and two decode replicas.
planner::Deployment Live(const PlannerAdvisorOptions& o) {
  planner::Deployment d;
  d.disaggregated = true;
  d.prefill_replicas = 1;
  d.replicas = 2;
  d.prefill = o.recommend.prefill;
  d.engine = o.recommend.engine;
  d.transport = o.recommend.transport;
  return d;
}

// What the live deployment would measure if its phases ran `truth` times the profile's time:
// the simulator's mean TTFT and TPOT on the corrected profile.
planner::SimulationResult Measure(const PlannerAdvisorOptions& o, const planner::Workload& w,
                                  double rate, const planner::Corrections& truth) {
  absl::StatusOr<planner::SimulationResult> r =
      planner::Simulate(planner::Corrected(o.profile, truth), Live(o), w, rate);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

// The fit recovers how much slower or faster each phase runs than profiled, from nothing but
// the mean TTFT and TPOT a deployment measured, under enough load that queueing (which grows
// faster than the step times) is part of both: a plain measured/predicted ratio would not.
TEST(PlannerAdvisorTest, CorrectionFactorsRecoverHowMuchSlowerEachPhaseRuns) {
  const PlannerAdvisorOptions o = Options125m();
  planner::Workload w = o.slo;
  w.input_len = 768;
  w.input_len_range = 0.5;
  w.output_len = 96;
  w.output_len_range = 0.5;
  const double rate = 0.6;
  for (const planner::Corrections truth : {planner::Corrections{.prefill = 1.6, .decode = 0.7},
                                           planner::Corrections{.prefill = 0.5, .decode = 2.2},
                                           planner::Corrections{.prefill = 1, .decode = 1}}) {
    const planner::SimulationResult measured = Measure(o, w, rate, truth);
    absl::StatusOr<planner::Corrections> fit = planner::FitCorrections(
        o.profile, Live(o), w, rate, measured.ttft.mean, measured.tpot.mean);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_NEAR(fit->prefill / truth.prefill, 1, 0.03) << truth.prefill;
    EXPECT_NEAR(fit->decode / truth.decode, 1, 0.03) << truth.decode;
  }
  // The proportional correction is wrong at this load: predicted TTFT is not linear in the
  // prefill time once requests queue behind each other.
  const planner::Corrections slow{.prefill = 1.6, .decode = 1};
  const double naive = Measure(o, w, rate, slow).ttft.mean / Measure(o, w, rate, {}).ttft.mean;
  EXPECT_GT(std::abs(naive / slow.prefill - 1), 0.1) << naive;
  // Measurements beyond what any factor explains end at the bounds.
  absl::StatusOr<planner::Corrections> beyond =
      planner::FitCorrections(o.profile, Live(o), w, rate, 1e-6, 1e3);
  ASSERT_TRUE(beyond.ok()) << beyond.status();
  EXPECT_EQ(beyond->prefill, planner::Corrections::kMin);
  EXPECT_EQ(beyond->decode, planner::Corrections::kMax);
}

// A round fits the factors to what the window measured on the replicas in rotation, smooths
// them with the earlier rounds', exports them, and plans on the profile scaled by them; with
// planner.correction off it plans on the profile as measured.
TEST(PlannerAdvisorTest, ARoundPlansOnTheProfileCorrectedToWhatTheDeploymentMeasured) {
  PlannerAdvisorOptions o = Options125m();
  o.live = [] { return LiveReplicas{.prefill = 1, .decode = 2}; };
  const planner::Corrections truth{.prefill = 2.5, .decode = 1.5};
  testing::ManualTimeSource clock;

  // The window the router would measure on that deployment: the lengths, and the mean TTFT and
  // TPOT that the slower phases give at that rate.
  const double rate = 0.5;
  WorkloadStats lengths(std::chrono::seconds(120));
  Drive(lengths, clock, rate, 120, 768, 96, 32);
  const WorkloadStats::Snapshot s = lengths.Take(clock.Now());
  const planner::Workload w = PlannerAdvisor::WorkloadOf(s, o.slo);
  const planner::SimulationResult measured = Measure(o, w, s.arrival_rate, truth);

  WorkloadStats stats(std::chrono::seconds(120));
  metrics::Metrics registry;
  PlannerAdvisor corrected(o, stats, &registry.planner(), clock);
  Drive(stats, clock, rate, 120, 768, 96, 32, measured.ttft.mean, measured.tpot.mean);

  absl::StatusOr<PlannerAdvisor::Round> r = corrected.Update();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->fitted.has_value());
  EXPECT_NEAR(r->fitted->prefill / truth.prefill, 1, 0.05);
  EXPECT_NEAR(r->fitted->decode / truth.decode, 1, 0.05);
  EXPECT_EQ(r->applied.prefill, r->fitted->prefill);  // the first fit is taken whole
  ASSERT_TRUE(r->recommendation.has_value());
  absl::StatusOr<planner::Recommendation> want = planner::Recommend(
      planner::Corrected(o.profile, r->applied), PlannerAdvisor::WorkloadOf(r->measured, o.slo),
      r->measured.arrival_rate, o.recommend);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(r->recommendation->prefill_replicas, want->prefill_replicas);
  EXPECT_EQ(r->recommendation->decode_replicas, want->decode_replicas);
  EXPECT_EQ(r->recommendation->at_target.ttft.p90, want->at_target.ttft.p90);
  EXPECT_THAT(registry.Serialize(),
              HasSubstr("tandem_planner_correction_factor{phase=\"decode\"}"));
  EXPECT_EQ(registry.planner().correction_prefill->Value(), r->applied.prefill);
  EXPECT_EQ(registry.planner().correction_decode->Value(), r->applied.decode);

  // The slower machine needs more replicas than the profile alone says.
  absl::StatusOr<planner::Recommendation> uncorrected =
      planner::Recommend(o.profile, PlannerAdvisor::WorkloadOf(r->measured, o.slo),
                         r->measured.arrival_rate, o.recommend);
  ASSERT_TRUE(uncorrected.ok()) << uncorrected.status();
  EXPECT_GT(r->recommendation->prefill_replicas + r->recommendation->decode_replicas,
            uncorrected->prefill_replicas + uncorrected->decode_replicas);

  // The next window runs as profiled: its own fit is 1, and the factors move halfway there
  // (planner.correction_smoothing 0.5, geometrically).
  const planner::SimulationResult as_profiled = Measure(o, w, s.arrival_rate, {});
  clock.Advance(std::chrono::seconds(5));  // the first window's samples all leave it
  Drive(stats, clock, rate, 120, 768, 96, 32, as_profiled.ttft.mean, as_profiled.tpot.mean);
  absl::StatusOr<PlannerAdvisor::Round> next = corrected.Update();
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(next->fitted.has_value());
  EXPECT_NEAR(next->fitted->prefill, 1, 0.05);
  EXPECT_NEAR(next->applied.prefill, std::sqrt(r->applied.prefill * next->fitted->prefill), 1e-9);
  EXPECT_NEAR(next->applied.decode, std::sqrt(r->applied.decode * next->fitted->decode), 1e-9);

  // Off: no fit, the profile as measured.
  o.correction = false;
  WorkloadStats off_stats(std::chrono::seconds(120));
  PlannerAdvisor off(o, off_stats, nullptr, clock);
  Drive(off_stats, clock, rate, 120, 768, 96, 32, measured.ttft.mean, measured.tpot.mean);
  absl::StatusOr<PlannerAdvisor::Round> plain = off.Update();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->fitted.has_value());
  EXPECT_EQ(plain->applied.prefill, 1);
  EXPECT_EQ(plain->applied.decode, 1);
  ASSERT_TRUE(plain->recommendation.has_value());
  EXPECT_EQ(plain->recommendation->prefill_replicas, uncorrected->prefill_replicas);
  EXPECT_EQ(plain->recommendation->decode_replicas, uncorrected->decode_replicas);
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
