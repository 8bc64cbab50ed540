// The planner, live (issue #21, "Use it"): every interval the workload the router measured
// (WorkloadStats: arrival rate, prompt and output lengths) becomes a planner::Workload with the
// configured SLOs, planner::Recommend sizes the router's own deployment shape (colocated, or
// prefill:decode) for the measured rate with headroom by simulating it on the engine profile,
// and the replicas per role are exported (tandem_planner_recommended_replicas{role}) for the
// autoscalers. Before it plans, a round fits correction factors: how much slower or faster than
// the profile each phase runs here (other hardware, a noisy host, costs the profile left out),
// found by simulating the live deployment at the measured workload until its mean TTFT and TPOT
// are the measured ones, as NVIDIA Dynamo's SLA planner corrects its interpolated TTFT and ITL.
// The balancer's 90% rule stays the fast, local reaction to a falling hit rate;
// this is the slow, global one (docs/architecture.md, "The placement planner").
//
// Threads: Start runs Update on a thread of its own; no lock is held while it simulates.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "common/planner/recommend.h"
#include "common/util/time_source.h"
#include "router/workload_stats.h"

namespace tandem::router {

// The replicas the router sends to now, per role (colocated: all of them in `decode`).
struct LiveReplicas {
  int prefill = 0;
  int decode = 0;
};

struct PlannerAdvisorOptions {
  planner::EngineProfile profile;
  // The SLOs (slo_ttft_s, slo_tpot_s) and attainment; lengths come from the measurement.
  planner::Workload slo;
  planner::RecommendOptions recommend;
  // Whether the router, the store shards and the clients run on the replicas' cores, as in
  // the profile's calibration (bench/serving/local_cluster.py) and on one machine: then the
  // profile's shared_overhead_seconds and shared_step_overhead_seconds are charged to the
  // replicas. False (planner.shared_stack_cpu's default) where they have machines or pods of
  // their own, as on Kubernetes: the advisor plans with those costs at zero.
  bool shared_stack_cpu = false;
  std::chrono::duration<double> interval = std::chrono::seconds(60);
  // Finished requests the window needs before its workload is planned for; with fewer, the
  // recommendation is the smallest deployment (one replica per role).
  int64_t min_requests = 50;
  // Correction factors (planner.correction): each round with enough requests fits them to the
  // measured mean TTFT and TPOT of the deployment `live` reports, and plans on the profile
  // scaled by them. Off, or without `live`, the profile is planned with as measured.
  bool correction = true;
  // The newest fit's weight in the factors the round plans with (a geometric moving average,
  // so one noisy window moves them only part of the way).
  double correction_smoothing = 0.5;
  std::function<LiveReplicas()> live;
};

class PlannerAdvisor {
 public:
  // `metrics` may be null (no export). `stats` and `clock` must outlive the advisor.
  PlannerAdvisor(PlannerAdvisorOptions options, WorkloadStats& stats,
                 metrics::PlannerMetrics* metrics, const TimeSource& clock);
  ~PlannerAdvisor();  // stops the thread

  // One round on the caller's thread: measure, plan, export. No recommendation when the window
  // holds too few requests (one replica per role is exported); an error when the profile cannot run
  // the workload (a prompt beyond its KV budget, say), which the thread logs.
  struct Round {
    WorkloadStats::Snapshot measured;
    std::optional<planner::Corrections> fitted;  // this round's own fit, when it made one
    planner::Corrections applied;                // what it planned with
    std::optional<planner::Recommendation> recommendation;
  };
  absl::StatusOr<Round> Update();

  // Runs Update every interval until destruction.
  void Start();

  // The workload to plan for, given what the window measured: lengths uniform with the
  // measured mean and spread (a uniform distribution's range is √3 standard deviations).
  static planner::Workload WorkloadOf(const WorkloadStats::Snapshot& s,
                                      const planner::Workload& slo);

 private:
  void Loop();
  // The recommended replicas per role (prefill ignored when colocated) and feasibility.
  void Publish(int prefill, int decode, bool feasible);
  // This round's fit of the correction factors to the deployment `live` reports; none when
  // correction is off or a role has no replica in rotation.
  absl::StatusOr<std::optional<planner::Corrections>> FitLive(const WorkloadStats::Snapshot& s,
                                                              const planner::Workload& w);

  const PlannerAdvisorOptions options_;
  WorkloadStats& stats_;
  metrics::PlannerMetrics* const metrics_;
  const TimeSource& clock_;
  absl::Mutex mu_;
  std::optional<planner::Corrections> corrections_
      ABSL_GUARDED_BY(mu_);  // the smoothed fits so far
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tandem::router
