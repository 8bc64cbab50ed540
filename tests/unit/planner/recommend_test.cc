#include "common/planner/recommend.h"

#include <string>

#include "common/util/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::planner {
namespace {

using ::testing::HasSubstr;

// The checked-in profile of the 125M shape on one thread (bench/profiles/).
EngineProfile Profile125m() {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/bench/profiles/125m-bf16-1t.json";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<EngineProfile> p = EngineProfile::FromJson(*text, path);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

Workload Slo(int input, int output) {
  Workload w;
  w.input_len = input;
  w.input_len_range = 0.3;
  w.output_len = output;
  w.output_len_range = 0.3;
  w.num_requests = 300;
  w.slo_ttft_s = 2.0;
  w.slo_tpot_s = 0.05;
  return w;
}

RecommendOptions Options(bool disaggregated, const EngineProfile& p) {
  RecommendOptions o;
  o.disaggregated = disaggregated;
  o.engine.max_num_seqs = 64;
  o.engine.num_blocks = (int64_t{4} << 30) / (p.kv_bytes_per_token * p.block_size);
  o.prefill = o.engine;
  o.headroom = 1.0;
  return o;
}

// Whether any deployment of the shape with n replicas meets the workload at `rate`.
bool AnyMeets(const EngineProfile& p, const Workload& w, const RecommendOptions& o, int n,
              double rate) {
  Deployment d;
  d.disaggregated = o.disaggregated;
  d.engine = o.engine;
  d.prefill = o.prefill;
  for (int prefill = o.disaggregated ? 1 : 0; prefill < (o.disaggregated ? n : 1); ++prefill) {
    d.prefill_replicas = prefill;
    d.replicas = n - prefill;
    absl::StatusOr<SimulationResult> r = Simulate(p, d, JudgedAt(w, rate), rate);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r->attainment >= w.attainment) return true;
  }
  return false;
}

// The recommendation meets the SLOs at the rate, and no deployment of the same shape with one
// replica fewer does: it is the smallest.
TEST(RecommendTest, IsTheSmallestDeploymentThatMeetsTheRate) {
  const EngineProfile p = Profile125m();
  for (bool disaggregated : {false, true}) {
    SCOPED_TRACE(disaggregated ? "disaggregated" : "colocated");
    const Workload w = Slo(1024, 64);
    const RecommendOptions o = Options(disaggregated, p);
    absl::StatusOr<Recommendation> r = Recommend(p, w, 3.0, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->feasible);
    EXPECT_EQ(r->copies, 1);
    EXPECT_GE(r->at_target.attainment, w.attainment);
    const int n = r->prefill_replicas + r->decode_replicas;
    EXPECT_EQ(r->prefill_replicas > 0, disaggregated);
    EXPECT_TRUE(AnyMeets(p, w, o, n, 3.0));
    if (n > (disaggregated ? 2 : 1)) EXPECT_FALSE(AnyMeets(p, w, o, n - 1, 3.0));
  }
}

// The planner's answer to a workload shift: decode-heavy traffic wants most replicas decoding,
// prefill-heavy traffic most of them prefilling, at the same request rate.
TEST(RecommendTest, AWorkloadShiftMovesTheSplit) {
  const EngineProfile p = Profile125m();
  const RecommendOptions o = Options(true, p);
  absl::StatusOr<Recommendation> decode_heavy = Recommend(p, Slo(64, 256), 8.0, o);
  absl::StatusOr<Recommendation> prefill_heavy = Recommend(p, Slo(1536, 32), 8.0, o);
  ASSERT_TRUE(decode_heavy.ok()) << decode_heavy.status();
  ASSERT_TRUE(prefill_heavy.ok()) << prefill_heavy.status();
  EXPECT_LT(decode_heavy->prefill_replicas, decode_heavy->decode_replicas);
  EXPECT_GT(prefill_heavy->prefill_replicas, prefill_heavy->decode_replicas);
}

// Headroom sizes for a higher rate, never a smaller deployment.
TEST(RecommendTest, HeadroomSizesForMore) {
  const EngineProfile p = Profile125m();
  RecommendOptions o = Options(false, p);
  absl::StatusOr<Recommendation> exact = Recommend(p, Slo(1024, 64), 3.0, o);
  o.headroom = 2.0;
  absl::StatusOr<Recommendation> doubled = Recommend(p, Slo(1024, 64), 3.0, o);
  ASSERT_TRUE(exact.ok() && doubled.ok());
  EXPECT_DOUBLE_EQ(doubled->target_rate, 6.0);
  EXPECT_GT(doubled->decode_replicas, exact->decode_replicas);
}

// Beyond max_unit, deployments are copies of a unit; beyond max_replicas, the recommendation
// says it falls short and gives the most it may.
TEST(RecommendTest, LargeRatesUseCopiesAndTooLargeOnesSaySo) {
  const EngineProfile p = Profile125m();
  RecommendOptions o = Options(false, p);
  o.max_unit = 4;
  o.max_replicas = 400;
  absl::StatusOr<Recommendation> big = Recommend(p, Slo(1024, 64), 30.0, o);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(big->feasible);
  EXPECT_GT(big->copies, 1);
  EXPECT_LE(big->unit.replicas, 4);
  EXPECT_EQ(big->decode_replicas, big->unit.replicas * big->copies);
  // One copy fewer of the largest unit misses the rate: the copies are the fewest.
  EXPECT_FALSE(AnyMeets(p, Slo(1024, 64), o, 4, 30.0 / (big->copies - 1)));
  // And each copy is the smallest that meets its share.
  EXPECT_TRUE(AnyMeets(p, Slo(1024, 64), o, big->unit.replicas, 30.0 / big->copies));
  if (big->unit.replicas > 1) {
    EXPECT_FALSE(AnyMeets(p, Slo(1024, 64), o, big->unit.replicas - 1, 30.0 / big->copies));
  }

  o.max_replicas = 8;
  absl::StatusOr<Recommendation> capped = Recommend(p, Slo(1024, 64), 30.0, o);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_FALSE(capped->feasible);
  EXPECT_EQ(capped->decode_replicas, 8);
}

TEST(RecommendTest, BadArgumentsAreClearErrors) {
  const EngineProfile p = Profile125m();
  RecommendOptions o = Options(true, p);
  EXPECT_THAT(Recommend(p, Slo(64, 64), 0, o).status().message(), HasSubstr("rate"));
  EXPECT_THAT(Recommend(p, Slo(64, 64), -1, o).status().message(), HasSubstr("rate"));
  o.max_replicas = 1;
  EXPECT_THAT(Recommend(p, Slo(64, 64), 1, o).status().message(), HasSubstr("max_replicas"));
  o.max_replicas = 8;
  o.headroom = 0.5;
  EXPECT_THAT(Recommend(p, Slo(64, 64), 1, o).status().message(), HasSubstr("headroom"));
}

}  // namespace
}  // namespace tandem::planner
