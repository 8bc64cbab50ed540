#pragma once

// Replica counts for a live workload: the smallest deployment of the router's own shape
// (colocated, or prefill:decode) that meets the workload's SLO attainment at the observed
// request rate with headroom, by simulation. The router's planner advisor
// (router/planner_advisor.h) runs it on the workload it measures and exports the counts for
// the autoscalers; `tandem plan --rate` prints it.

#include <functional>

#include "absl/status/statusor.h"
#include "common/planner/planner.h"

namespace tandem::planner {

struct RecommendOptions {
  bool disaggregated = true;  // the shape to size (a running deployment does not switch)
  EngineLimits prefill;       // a prefill replica's limits
  EngineLimits engine;        // a colocated or decode replica's; max_num_seqs as configured
  std::string transport = "shm";
  int max_replicas = 64;   // the largest deployment considered, all roles together
  double headroom = 1.25;  // size for rate × headroom
  // Deployments above this many replicas are copies of one of at most this size: the fewest
  // copies that meet the rate, each as small as its share allows.
  int max_unit = 16;
};

struct Recommendation {
  // False when even max_replicas miss the attainment at the rate: the counts are then the
  // largest deployment's (the most the autoscaler may add).
  bool feasible = false;
  int prefill_replicas = 0;  // 0 when colocated
  int decode_replicas = 0;   // colocated: every replica
  double target_rate = 0;    // rate × headroom, requests/s
  Deployment unit;           // one copy
  int copies = 1;
  SimulationResult at_target;  // one copy at its share of target_rate
};

// InvalidArgument for a rate that is not positive or finite, or max_replicas below the shape's
// minimum (1 colocated, 2 disaggregated).
absl::StatusOr<Recommendation> Recommend(const EngineProfile& profile, const Workload& w,
                                         double rate, const RecommendOptions& options);

// How much slower (> 1) or faster than the profile each phase runs on a live deployment: the
// profile's prefill steps (and handoff overhead) and its decode steps (and per-message
// overheads) times these. NVIDIA Dynamo's SLA planner corrects its predictions the same way.
struct Corrections {
  double prefill = 1;
  double decode = 1;
  static constexpr double kMin = 0.1;
  static constexpr double kMax = 10;
};

// The profile with each phase's times scaled by `c`.
EngineProfile Corrected(const EngineProfile& profile, const Corrections& c);

// The factors, each within [Corrections::kMin, kMax], at which the simulator's mean TTFT and
// TPOT of deployment `live` running `w` at `rate` are the measured `ttft_s` and `tpot_s` (a
// factor stays 1 when its measurement is not positive). Alternating bisections on a log scale:
// TPOT for the decode factor, then TTFT for the prefill factor, twice, since each phase also
// delays the other. A measurement beyond what the bounds explain ends at the bound. Fitting
// through the simulator keeps queueing out of the factors, which a plain measured/predicted
// ratio takes for a slower engine.
absl::StatusOr<Corrections> FitCorrections(const EngineProfile& profile, const Deployment& live,
                                           const Workload& w, double rate, double ttft_s,
                                           double tpot_s);

}  // namespace tandem::planner
