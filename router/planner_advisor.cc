#include "router/planner_advisor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::router {
namespace {

// A length distribution as the simulator draws it: uniform in mean × [1 - range, 1 + range].
void Lengths(const WorkloadStats::Moments& m, int32_t& len, double& range) {
  const double mean = std::max(1.0, m.mean);
  len = static_cast<int32_t>(std::clamp(std::llround(mean), 1LL, 1LL << 24));
  range = std::clamp(std::sqrt(3.0) * m.stddev / mean, 0.0, 1.0);
}

// The options as planned with: the profile's shared-stack costs only where the stack shares
// the replicas' cores (PlannerAdvisorOptions::shared_stack_cpu).
PlannerAdvisorOptions WithStackCpu(PlannerAdvisorOptions o) {
  if (!o.shared_stack_cpu) {
    o.profile.shared_overhead_seconds = 0;
    o.profile.shared_step_overhead_seconds = 0;
  }
  return o;
}

}  // namespace

PlannerAdvisor::PlannerAdvisor(PlannerAdvisorOptions options, WorkloadStats& stats,
                               metrics::PlannerMetrics* metrics, const TimeSource& clock)
    : options_(WithStackCpu(std::move(options))), stats_(stats), metrics_(metrics), clock_(clock) {
  if (metrics_ != nullptr && metrics_->correction_prefill != nullptr) {
    metrics_->correction_prefill->Set(1);  // as profiled, until a round fits them
    metrics_->correction_decode->Set(1);
  }
}

PlannerAdvisor::~PlannerAdvisor() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void PlannerAdvisor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

planner::Workload PlannerAdvisor::WorkloadOf(const WorkloadStats::Snapshot& s,
                                             const planner::Workload& slo) {
  planner::Workload w = slo;
  Lengths(s.prompt_tokens, w.input_len, w.input_len_range);
  Lengths(s.output_tokens, w.output_len, w.output_len_range);
  return w;
}

absl::StatusOr<std::optional<planner::Corrections>> PlannerAdvisor::FitLive(
    const WorkloadStats::Snapshot& s, const planner::Workload& w) {
  if (!options_.correction || !options_.live) return std::optional<planner::Corrections>();
  const LiveReplicas live = options_.live();
  const planner::RecommendOptions& r = options_.recommend;
  // Nothing to fit while a role has no replica in rotation: the measurements are of a
  // deployment that is not there (or of failures).
  if (live.decode < 1 || (r.disaggregated && live.prefill < 1)) {
    return std::optional<planner::Corrections>();
  }
  planner::Deployment d;
  d.disaggregated = r.disaggregated;
  d.prefill_replicas = r.disaggregated ? live.prefill : 0;
  d.replicas = live.decode;
  d.prefill = r.prefill;
  d.engine = r.engine;
  d.transport = r.transport;
  TANDEM_ASSIGN_OR_RETURN(const planner::Corrections fit,
                          planner::FitCorrections(options_.profile, d, w, s.arrival_rate,
                                                  s.ttft_s.count > 0 ? s.ttft_s.mean : 0,
                                                  s.tpot_s.count > 0 ? s.tpot_s.mean : 0));
  return std::optional<planner::Corrections>(fit);
}

void PlannerAdvisor::Publish(int prefill, int decode, bool feasible) {
  if (metrics_ == nullptr) return;
  if (metrics_->recommended_prefill != nullptr) metrics_->recommended_prefill->Set(prefill);
  metrics_->recommended_decode->Set(decode);
  metrics_->feasible->Set(feasible ? 1 : 0);
}

absl::StatusOr<PlannerAdvisor::Round> PlannerAdvisor::Update() {
  Round round;
  round.measured = stats_.Take(clock_.Now());
  const WorkloadStats::Snapshot& s = round.measured;
  if (metrics_ != nullptr) {
    metrics_->arrival_rate->Set(s.arrival_rate);
    metrics_->mean_prompt_tokens->Set(s.prompt_tokens.mean);
    metrics_->mean_output_tokens->Set(s.output_tokens.mean);
  }
  if (s.output_tokens.count < options_.min_requests || !(s.arrival_rate > 0)) {
    // Too little traffic to plan for: the smallest deployment of the shape, so the
    // autoscalers may scale down when it goes quiet (their other signals still scale up).
    Publish(1, 1, true);
    return round;
  }
  const planner::Workload w = WorkloadOf(s, options_.slo);
  TANDEM_ASSIGN_OR_RETURN(round.fitted, FitLive(s, w));
  {
    absl::MutexLock lock(&mu_);
    if (round.fitted.has_value()) {
      // A geometric moving average: factors multiply, so 0.5 and 2 are equally far from 1.
      const double a = corrections_.has_value() ? options_.correction_smoothing : 1;
      const planner::Corrections old = corrections_.value_or(*round.fitted);
      corrections_ = planner::Corrections{
          .prefill = std::pow(round.fitted->prefill, a) * std::pow(old.prefill, 1 - a),
          .decode = std::pow(round.fitted->decode, a) * std::pow(old.decode, 1 - a)};
    }
    if (options_.correction) round.applied = corrections_.value_or(planner::Corrections{});
  }
  if (metrics_ != nullptr && metrics_->correction_prefill != nullptr) {
    metrics_->correction_prefill->Set(round.applied.prefill);
    metrics_->correction_decode->Set(round.applied.decode);
  }
  absl::StatusOr<planner::Recommendation> r = planner::Recommend(
      planner::Corrected(options_.profile, round.applied), w, s.arrival_rate, options_.recommend);
  if (!r.ok()) return r.status();
  Publish(r->prefill_replicas, r->decode_replicas, r->feasible);
  if (metrics_ != nullptr) {
    metrics_->predicted_ttft_p90->Set(r->at_target.ttft.p90);
    metrics_->predicted_tpot_p90->Set(r->at_target.tpot.p90);
  }
  round.recommendation = *std::move(r);
  return round;
}

void PlannerAdvisor::Loop() {
  const absl::Duration interval = absl::Seconds(options_.interval.count());
  while (!stop_.WaitForNotificationWithTimeout(interval)) {
    absl::StatusOr<Round> r = Update();
    if (!r.ok()) {
      Log(LogLevel::kWarning, "planner",
          absl::StrFormat("no recommendation: %s", r.status().message()));
    } else if (r->recommendation.has_value()) {
      const WorkloadStats::Snapshot& s = r->measured;
      const planner::Recommendation& rec = *r->recommendation;
      Log(LogLevel::kInfo, "planner",
          absl::StrFormat(
              "%.3g req/s (prompts %.0f, outputs %.0f tokens; measured TTFT %.0f ms, "
              "TPOT %.1f ms mean; phases at %.2fx/%.2fx the profile's prefill/decode time): "
              "recommend %d prefill + %d decode replicas%s "
              "(predicted TTFT p90 %.0f ms, TPOT p90 %.1f ms at %.3g req/s)",
              s.arrival_rate, s.prompt_tokens.mean, s.output_tokens.mean, s.ttft_s.mean * 1e3,
              s.tpot_s.mean * 1e3, r->applied.prefill, r->applied.decode, rec.prefill_replicas,
              rec.decode_replicas,
              rec.feasible ? "" : ", the most allowed, and still short of the SLOs",
              rec.at_target.ttft.p90 * 1e3, rec.at_target.tpot.p90 * 1e3, rec.target_rate));
    }
  }
}

}  // namespace tandem::router
