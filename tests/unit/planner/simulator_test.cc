#include "common/planner/simulator.h"

#include <chrono>
#include <limits>

#include "common/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::planner {
namespace {

using ::testing::HasSubstr;

// A synthetic engine whose steps cost exactly: prefill 1 ms + 0.1 ms a token (no attention
// term), decode 5 ms + 0.1 ms a sequence; KV 1 KiB a token in blocks of 16; a transfer of a
// prompt's blocks costs 2 ms a MiB.
EngineProfile Synthetic(double decode_base = 5e-3) {
  EngineProfile p;
  p.threads = 2;
  p.num_layers = p.pop_start_layer = 4;
  p.kv_bytes_per_token = 1024;
  p.block_size = 16;
  for (int64_t tokens : {16, 256, 1024}) {
    p.prefill.push_back({tokens, 0, 1e-3 + 1e-4 * tokens});
  }
  for (int64_t batch : {1, 8, 64})
    p.decode.push_back({batch, 64 * batch, decode_base + 1e-4 * batch});
  p.transfer = {{"shm", 1 << 20, 2e-3}, {"shm", 16 << 20, 32e-3}};
  return p;
}

Deployment Colocated(int replicas, int64_t blocks = 1 << 16) {
  Deployment d;
  d.replicas = replicas;
  d.engine.num_blocks = blocks;
  return d;
}

Deployment Disaggregated(int prefill, int decode) {
  Deployment d = Colocated(decode);
  d.disaggregated = true;
  d.prefill_replicas = prefill;
  d.prefill = d.engine;
  return d;
}

Workload Fixed(int input, int output, int requests) {
  Workload w;
  w.input_len = input;
  w.output_len = output;
  w.num_requests = requests;
  return w;
}

// One request alone on a colocated replica: a 1000-token prompt in chunks of 512 (two steps:
// 512 then 488 tokens), then a decode step per further token.
TEST(SimulatorTest, OneRequestFollowsTheStepTimes) {
  auto r = Simulate(Synthetic(), Colocated(1), Fixed(1000, 11, 1), 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->ttft.p50, (1e-3 + 512e-4) + (1e-3 + 488e-4), 1e-9);
  EXPECT_NEAR(r->tpot.p50, 5e-3 + 1e-4, 1e-9);
  EXPECT_EQ(r->attainment, 1.0);  // no SLO: every request is good
}

// The serving stack's time per streamed token lengthens every step that streams one.
TEST(SimulatorTest, TokenOverheadLengthensEachStreamingStep) {
  EngineProfile p = Synthetic();
  p.token_overhead_seconds = 2e-4;
  auto r = Simulate(p, Colocated(1), Fixed(1000, 11, 1), 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  // The first chunk streams nothing; the second streams the first token.
  EXPECT_NEAR(r->ttft.p50, (1e-3 + 512e-4) + (1e-3 + 488e-4) + 2e-4, 1e-9);
  EXPECT_NEAR(r->tpot.p50, 5e-3 + 1e-4 + 2e-4, 1e-9);
}

// scheduler.stream_interval 4: of 11 tokens, the 1st, 5th, 9th and the last stream (as a decode
// worker sends them), so 7 fewer steps carry the overhead; a disaggregated decode replica
// streams its first token (the request's 2nd) at once, then the 6th, 10th and the last.
TEST(SimulatorTest, StreamIntervalChargesTheOverheadPerMessage) {
  EngineProfile p = Synthetic();
  p.token_overhead_seconds = 2e-4;
  Deployment every = Colocated(1), fourth = Colocated(1);
  fourth.engine.stream_interval = 4;
  auto a = Simulate(p, every, Fixed(1000, 11, 1), 1.0);
  auto b = Simulate(p, fourth, Fixed(1000, 11, 1), 1.0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->engine_busy_s - b->engine_busy_s, 7 * 2e-4, 1e-9);
  EXPECT_NEAR(a->ttft.p50, b->ttft.p50, 1e-12);  // the first token goes at once
  EXPECT_NEAR(b->tpot.p50, 5e-3 + 1e-4 + 3 * 2e-4 / 10, 1e-9);

  Deployment split = Disaggregated(1, 1);
  split.engine.stream_interval = 4;
  auto all = Simulate(p, Disaggregated(1, 1), Fixed(1000, 11, 1), 1.0);
  auto c = Simulate(p, split, Fixed(1000, 11, 1), 1.0);
  ASSERT_TRUE(all.ok() && c.ok());
  EXPECT_NEAR(all->engine_busy_s - c->engine_busy_s, (10 - 4) * 2e-4, 1e-9);
  EXPECT_NEAR(all->prefill_busy_s, c->prefill_busy_s, 1e-12);  // its one message either way
}

// An explicit schedule is simulated as given: two requests 1 s apart never meet, and goodput
// counts good requests per second from time 0 to the last token.
TEST(SimulatorTest, ExplicitSchedulesRunAsGiven) {
  Workload slo = Fixed(1, 1, 1);
  slo.slo_ttft_s = 1;
  const std::vector<SimRequest> schedule = {{0, 1000, 11}, {1, 1000, 11}};
  auto r = SimulateRequests(Synthetic(), Colocated(1), schedule, slo, 2.0);
  ASSERT_TRUE(r.ok()) << r.status();
  const double ttft = (1e-3 + 512e-4) + (1e-3 + 488e-4), e2e = ttft + 10 * (5e-3 + 1e-4);
  EXPECT_NEAR(r->ttft.p99, ttft, 1e-9);
  EXPECT_NEAR(r->duration_s, 1 + e2e, 1e-9);
  EXPECT_NEAR(r->goodput, 2 / (1 + e2e), 1e-9);
  EXPECT_FALSE(SimulateRequests(Synthetic(), Colocated(1), {{0, 0, 5}}, slo, 1).ok());
}

// The router sends a colocated request to the replica with the fewest sequences, then the
// fewest queued tokens (router/worker_pool.cc, PickDecode): a long prompt A on replica 0, two
// short ones B and C on replica 1 (C by tokens, the sequences being even), and then D on
// replica 0, behind A's first 512-token chunk, though replica 1 has less work queued. With a
// 50 ms TTFT bound, A and D miss it.
TEST(SimulatorTest, ColocatedRequestsGoToTheFewestSequencesAsTheRouterSendsThem) {
  Workload slo = Fixed(1, 1, 1);
  slo.slo_ttft_s = 0.05;
  const std::vector<SimRequest> schedule = {
      {0, 1000, 20}, {0.001, 10, 20}, {0.002, 10, 20}, {0.003, 10, 20}};
  auto r = SimulateRequests(Synthetic(), Colocated(2), schedule, slo, 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->attainment, 0.5);
}

// Disaggregated: the first token reaches the client after the prefill and the put of the
// prompt's full blocks (62 of 16 tokens: 992 KiB, below the smallest transfer sample, so at
// its 2 ms); the decode replica's first step after the get computes the partial block's 8
// tokens and the first token as a 9-token prefill.
TEST(SimulatorTest, DisaggregatedRequestPaysTheHandoff) {
  auto r = Simulate(Synthetic(), Disaggregated(1, 1), Fixed(1000, 3, 1), 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  const double put = 2e-3;
  const double prefill = (1e-3 + 512e-4) + (1e-3 + 488e-4);
  EXPECT_NEAR(r->ttft.p50, prefill + put, 1e-9);
  // Token 2 after the get and a 9-token step (below the smallest sample: as 16 tokens), token
  // 3 one decode step later.
  const double second = put + 1e-3 + 16e-4, third = 5e-3 + 1e-4;
  EXPECT_NEAR(r->tpot.p50, (second + third) / 2, 1e-9);
}

// The prefill worker's time per prompt it hands off (export, upload, answer) lengthens the step
// that finishes the prompt on the prefill replica, so it delays that request's first token
// and every prompt queued behind it; decode replicas are not charged.
TEST(SimulatorTest, HandoffOverheadOccupiesThePrefillReplica) {
  EngineProfile p = Synthetic();
  p.handoff_overhead_seconds = 0.05;
  const double put = 2e-3, prefill = (1e-3 + 512e-4) + (1e-3 + 488e-4);
  auto alone = Simulate(p, Disaggregated(1, 1), Fixed(1000, 3, 1), 1.0);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_NEAR(alone->ttft.p50, prefill + 0.05 + put, 1e-9);
  const double token2 = put + 1e-3 + 16e-4, token3 = 5e-3 + 1e-4;
  EXPECT_NEAR(alone->tpot.p50, (token2 + token3) / 2, 1e-9);  // as without it

  // A second prompt arriving while the first computes waits for the first's handoff too: a
  // 500-token prompt is one 51 ms step, plus 50 ms of handoff.
  const std::vector<SimRequest> two = {{0, 500, 3}, {0.01, 500, 3}};
  auto queued = SimulateRequests(p, Disaggregated(1, 1), two, Fixed(500, 3, 2), 1.0);
  ASSERT_TRUE(queued.ok()) << queued.status();
  const double step = 1e-3 + 500e-4, first = step + 0.05 + put;
  const double second = 2 * (step + 0.05) - 0.01 + put;
  EXPECT_NEAR(queued->ttft.p50, (first + second) / 2, 1e-9);
  EXPECT_NEAR(queued->prefill_busy_s, 2 * (step + 0.05), 1e-9);        // the handoffs on its core
  auto colocated = Simulate(p, Colocated(1), Fixed(1000, 3, 1), 1.0);  // no handoff, no charge
  ASSERT_TRUE(colocated.ok());
  EXPECT_NEAR(colocated->ttft.p50, prefill, 1e-9);
}

// A decode worker's time per import lengthens the first step it runs an imported sequence in:
// token 2 of that request and of every sequence sharing the step; never the first token.
TEST(SimulatorTest, ImportOverheadLengthensTheDecodeReplicasFirstStep) {
  EngineProfile p = Synthetic();
  p.import_overhead_seconds = 0.03;
  auto r = Simulate(p, Disaggregated(1, 1), Fixed(1000, 3, 1), 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  const double put = 2e-3, prefill = (1e-3 + 512e-4) + (1e-3 + 488e-4);
  EXPECT_NEAR(r->ttft.p50, prefill + put, 1e-9);
  const double second = put + 1e-3 + 16e-4 + 0.03, third = 5e-3 + 1e-4;
  EXPECT_NEAR(r->tpot.p50, (second + third) / 2, 1e-9);
  // Each role's steps, summed: the prefill chunks; the import step and one decode step (the
  // put between them is no replica's).
  EXPECT_NEAR(r->prefill_busy_s, prefill, 1e-9);
  EXPECT_NEAR(r->engine_busy_s, second - put + third, 1e-9);
}

// The shared processes' time per message (the router, the client) runs on an idle replica's
// core: free while one is idle, taken from the steps when none is.
TEST(SimulatorTest, SharedOverheadRunsOnAnIdleCoreOrTakesFromTheBusyOnes) {
  EngineProfile p = Synthetic();
  p.shared_overhead_seconds = 3e-4;
  const double ttft = (1e-3 + 512e-4) + (1e-3 + 488e-4), tpot = 5e-3 + 1e-4;
  // Alone on two replicas' cores, or disaggregated: the other core is idle and takes it.
  for (const Deployment& d : {Colocated(2), Disaggregated(1, 1)}) {
    auto r = Simulate(p, d, Fixed(1000, 11, 1), 1.0);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->tpot.p50, d.disaggregated ? (2e-3 + 1e-3 + 16e-4 + 9 * tpot) / 10 : tpot, 1e-9)
        << d.Describe();
  }
  // One replica: each token's message is taken from the step that computes the next one; the
  // first token's from the first decode step, so TTFT is unchanged.
  auto one = Simulate(p, Colocated(1), Fixed(1000, 11, 1), 1.0);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NEAR(one->ttft.p50, ttft, 1e-9);
  EXPECT_NEAR(one->tpot.p50, tpot + 3e-4, 1e-9);
  EXPECT_NEAR(one->engine_busy_s, 2 * 1e-3 + 1000e-4 + 10 * tpot, 1e-9);  // the worker's own
  // The last token's message occupies the idle core: a prompt arriving 0.1 ms after it waits
  // the other 0.2 ms.
  const double end = ttft + 10 * (tpot + 3e-4);
  const std::vector<SimRequest> two = {{0, 1000, 11}, {end + 1e-4, 16, 1}};
  auto queued = SimulateRequests(p, Colocated(1), two, Fixed(1, 1, 2), 1.0);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_NEAR(queued->ttft.p50, (ttft + 2e-4 + 1e-3 + 16e-4) / 2, 1e-9);
  // Both replicas stepping: each streams a message per step, both messages are shared alike,
  // so each step takes one message's time more, but at the end, when one replica is idle.
  const std::vector<SimRequest> pair = {{0, 16, 11}, {0, 16, 11}};
  auto both = SimulateRequests(p, Colocated(2), pair, Fixed(16, 11, 2), 1.0);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_GT(both->tpot.p50, tpot + 2.5e-4);
  EXPECT_LE(both->tpot.p50, tpot + 3e-4 + 1e-12);

  // A step's messages reach them together: the per-step part once per streaming step, however
  // many it streams; the prefill chunk that streams nothing costs nothing.
  p.shared_overhead_seconds = 0;
  p.shared_step_overhead_seconds = 4e-4;
  auto single = Simulate(p, Colocated(1), Fixed(1000, 11, 1), 1.0);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_NEAR(single->ttft.p50, ttft, 1e-9);
  EXPECT_NEAR(single->tpot.p50, tpot + 4e-4, 1e-9);
  // Two sequences on one replica stream two messages a step: 4e-4 once a step, where the same
  // cost per message takes 8e-4 (but in the steps that stream one).
  auto per_step = SimulateRequests(p, Colocated(1), pair, Fixed(16, 11, 2), 1.0);
  p.shared_overhead_seconds = 4e-4;
  p.shared_step_overhead_seconds = 0;
  auto per_message = SimulateRequests(p, Colocated(1), pair, Fixed(16, 11, 2), 1.0);
  ASSERT_TRUE(per_step.ok() && per_message.ok());
  EXPECT_GT(per_message->tpot.p50 - per_step->tpot.p50, 3e-4);
  EXPECT_LE(per_message->tpot.p50 - per_step->tpot.p50, 4e-4 + 1e-12);
}

// A trace's send times: scaled uniformly to a mean rate (bursts keep their shape), repeated end
// to end when more requests are wanted.
TEST(SimulatorTest, TracesAreReplayedScaledAndTiled) {
  const std::vector<double> t = {10, 10, 10.5, 12};  // 3 gaps over 2 s: 1.5 req/s
  EXPECT_DOUBLE_EQ(TraceRate(t), 1.5);
  EXPECT_EQ(ReplayArrivals(t, 3.0), (std::vector<double>{0, 0, 0.25, 1}));
  EXPECT_EQ(ReplayArrivals(t, std::numeric_limits<double>::infinity()),
            (std::vector<double>{0, 0, 0.5, 2}));
  EXPECT_EQ(TileTimestamps(t, 6),
            (std::vector<double>{10, 10, 10.5, 12, 12 + 2.0 / 3, 12 + 2.0 / 3}));
  EXPECT_EQ(TraceRate(std::vector<double>{3, 3}), 0);  // spans no time
  const std::vector<double> five = TraceSchedule(t, 5, 3.0);  // the tile at half the recorded gaps
  ASSERT_EQ(five.size(), 5u);
  EXPECT_NEAR(five[3], 1, 1e-12);
  EXPECT_NEAR(five[4], (2 + 2.0 / 3) / 2, 1e-12);
  EXPECT_TRUE(TraceSchedule(std::vector<double>{3, 3}, 4, 3.0).empty());  // Poisson instead

  // Simulated: two prompts 1 s apart in the trace, replayed at 2 req/s, run 0.5 s apart, each
  // alone; a trace of 1 s gaps at 1000 req/s queues them behind each other.
  Workload w = Fixed(1, 1, 2);
  w.trace = {{0, 1000, 11}, {1, 1000, 11}};
  const double ttft = (1e-3 + 512e-4) + (1e-3 + 488e-4), e2e = ttft + 10 * (5e-3 + 1e-4);
  auto apart = Simulate(Synthetic(), Colocated(1), w, 2.0);
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_NEAR(apart->ttft.p99, ttft, 1e-9);
  EXPECT_NEAR(apart->duration_s, 0.5 + e2e, 1e-9);
  auto crowded = Simulate(Synthetic(), Colocated(1), w, 1000.0);
  ASSERT_TRUE(crowded.ok());
  EXPECT_GT(crowded->ttft.p99, ttft + 0.05);
  w.num_requests = 5;  // the trace three times over (and a bit)
  auto tiled = Simulate(Synthetic(), Colocated(1), w, 2.0);
  ASSERT_TRUE(tiled.ok());
  EXPECT_NEAR(tiled->duration_s, 4 * 0.5 + e2e, 1e-9);
}

// Long prompts arriving into a colocated replica stall its decodes (a chunk rides in the same
// step); a disaggregated decode replica never sees them: DistServe's point.
TEST(SimulatorTest, ColocatedPrefillInflatesTpot) {
  Workload w = Fixed(2000, 64, 400);
  auto colocated = Simulate(Synthetic(), Colocated(2), w, 2.0);
  auto disaggregated = Simulate(Synthetic(), Disaggregated(1, 1), w, 2.0);
  ASSERT_TRUE(colocated.ok() && disaggregated.ok());
  EXPECT_GT(colocated->tpot.p90, 1.3 * disaggregated->tpot.p90);
  EXPECT_GT(colocated->tpot.p99, 1.8 * disaggregated->tpot.p99);
}

TEST(SimulatorTest, ASmallKvBudgetPreemptsAndStillFinishesEverything) {
  // 40 blocks of 16 tokens: room for ~2 requests of 300 tokens at once.
  auto r = Simulate(Synthetic(), Colocated(1, 40), Fixed(200, 100, 50), 50.0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->preemptions, 0);
  EXPECT_GT(r->throughput, 0);
}

TEST(SimulatorTest, ImpossibleDeploymentsAreClearErrors) {
  EXPECT_THAT(Simulate(Synthetic(), Colocated(1, 4), Fixed(200, 100, 5), 1.0).status().message(),
              HasSubstr("KV budget"));
  EXPECT_THAT(Simulate(Synthetic(), Colocated(0), Fixed(200, 100, 5), 1.0).status().message(),
              HasSubstr("at least one replica"));
  Deployment grpc = Disaggregated(1, 1);
  grpc.transport = "grpc";
  EXPECT_THAT(Simulate(Synthetic(), grpc, Fixed(200, 100, 5), 1.0).status().message(),
              HasSubstr("no kv_transfer samples for grpc"));
  EXPECT_FALSE(Simulate(Synthetic(), Colocated(1), Fixed(200, 100, 5), 0).ok());
}

// Attainment falls as the rate rises past what the replica serves, and the search lands where
// it crosses the target.
TEST(PlannerTest, MaxGoodRateIsWhereAttainmentCrossesTheTarget) {
  Workload w = Fixed(256, 32, 400);
  w.slo_tpot_s = 8e-3;
  w.slo_ttft_s = 0.5;
  auto found = MaxGoodRate(Synthetic(), Colocated(1), w, 1e4);
  ASSERT_TRUE(found.ok()) << found.status();
  const double rate = found->first;
  ASSERT_GT(rate, 0);
  EXPECT_GE(found->second.attainment, w.attainment);
  auto above = Simulate(Synthetic(), Colocated(1), w, rate * 1.05);
  ASSERT_TRUE(above.ok());
  EXPECT_LT(above->attainment, w.attainment);
}

// A prefill-heavy workload with a tight TPOT SLO goes disaggregated; a decode-heavy one whose
// decode steps cost little goes colocated (both replicas decode and prefill).

// `budget` replicas with KV room for any request here and one batch limit, 64.
PlanOptions Options(int budget) {
  PlanOptions o;
  o.budget = budget;
  o.engine.num_blocks = o.prefill.num_blocks = 1 << 16;
  o.max_num_seqs = {64};
  return o;
}

TEST(PlannerTest, PicksTheDeploymentTheWorkloadFavours) {
  const PlanOptions o = Options(4);
  Workload prefill_heavy = Fixed(2000, 64, 300);
  prefill_heavy.slo_ttft_s = 2;
  prefill_heavy.slo_tpot_s = 12e-3;
  auto plan = Plan(Synthetic(), prefill_heavy, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);  // colocated 4, 1P+3D, 2P+2D, 3P+1D
  EXPECT_TRUE(plan->front().deployment.disaggregated) << CandidatesTable(*plan, 4);

  Workload decode_heavy = Fixed(32, 256, 300);
  decode_heavy.slo_ttft_s = 1;
  decode_heavy.slo_tpot_s = 50e-3;
  plan = Plan(Synthetic(), decode_heavy, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->front().deployment.disaggregated) << CandidatesTable(*plan, 4);
}

// Thousands of replicas are planned as copies of the best 16-replica deployment, in seconds.
TEST(PlannerTest, LargeBudgetsPlanAsCopiesQuickly) {
  const PlanOptions o = Options(2000);
  Workload w = Fixed(1000, 64, 300);
  w.slo_ttft_s = 2;
  w.slo_tpot_s = 20e-3;
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = Plan(Synthetic(), w, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->front().copies, 125);
  EXPECT_NEAR(plan->front().per_replica, plan->front().goodput / 2000, 1e-9);
  EXPECT_LT(seconds, 60);
}

}  // namespace
}  // namespace tandem::planner
