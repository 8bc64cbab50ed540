#pragma once

// The placement planner (DistServe's): for a profile, a workload and a budget of replicas, the
// deployment — colocated or disaggregated, the prefill:decode split, the decode batch limit —
// that serves the highest request rate at which the workload's SLO attainment holds, found by
// simulation (simulator.h).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/planner/simulator.h"

namespace tandem::planner {

struct PlanOptions {
  int budget = 2;  // replicas in all (each one engine as profiled)
  std::vector<int> max_num_seqs = {16, 32, 64, 128, 256};  // decode batch limits to try
  EngineLimits prefill;  // a prefill replica's limits (max_num_seqs: as the engine's)
  EngineLimits engine;   // a colocated or decode replica's (max_num_seqs: searched)
  std::string transport = "shm";
  bool colocated = true;
  bool disaggregated = true;
  // Budgets above this are planned as copies of the best deployment of this many replicas (the
  // router spreads load evenly, so k copies serve k times the rate), which keeps a plan for
  // thousands of replicas as cheap as one for `max_unit`.
  int max_unit = 16;
  double max_rate = 1e6;  // requests/s: the search's ceiling
};

struct Candidate {
  Deployment deployment;
  int copies = 1;      // of `deployment` within the budget
  double goodput = 0;  // requests/s at the SLO attainment, all copies
  double per_replica = 0;
  SimulationResult at_goodput;  // one copy, at its share of `goodput`
};

// `w` with enough requests to judge whether a deployment sustains `rate`: at least four
// request lifetimes (the TTFT bound plus an output at the TPOT bound) of arrivals, so a rate
// above what it sustains builds a queue that misses the SLOs.
Workload JudgedAt(const Workload& w, double rate);

// The highest rate (to 1% or better) at which `d` meets the workload's attainment; 0 when even
// a trickle of requests misses it. Also returns the simulation at that rate.
absl::StatusOr<std::pair<double, SimulationResult>> MaxGoodRate(const EngineProfile& profile,
                                                                const Deployment& d,
                                                                const Workload& w, double max_rate);

// The best candidate of each shape (colocated, and each prefill:decode split) with the batch
// limit that served it best, best goodput first.
absl::StatusOr<std::vector<Candidate>> Plan(const EngineProfile& profile, const Workload& w,
                                            const PlanOptions& options);

// The candidates as a Markdown table, and as JSON for machines.
std::string CandidatesTable(const std::vector<Candidate>& candidates, size_t max_rows);
std::string CandidatesJson(const std::vector<Candidate>& candidates);

}  // namespace tandem::planner
