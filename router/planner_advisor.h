// The planner, live (issue #21, "Use it"): every interval the workload the router measured
// (WorkloadStats: arrival rate, prompt and output lengths) becomes a planner::Workload with the
// configured SLOs, planner::Recommend sizes the router's own deployment shape (colocated, or
// prefill:decode) for the measured rate with headroom by simulating it on the engine profile,
// and the replicas per role are exported (tandem_planner_recommended_replicas{role}) for the
// autoscalers. The balancer's 90% rule stays the fast, local reaction to a falling hit rate;
// this is the slow, global one (docs/architecture.md, "The placement planner").
//
// Threads: Start runs Update on a thread of its own; no lock is held while it simulates.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "common/planner/recommend.h"
#include "common/util/time_source.h"
#include "router/workload_stats.h"

namespace tandem::router {

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

  const PlannerAdvisorOptions options_;
  WorkloadStats& stats_;
  metrics::PlannerMetrics* const metrics_;
  const TimeSource& clock_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tandem::router
