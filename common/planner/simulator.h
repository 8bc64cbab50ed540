#pragma once

// A discrete-event simulator of Tandem's own scheduling, driven by an engine profile: the
// router's choice of replica, each engine's steps (continuous batching with chunked prefill
// under max_num_batched_tokens, chunk_size, max_num_seqs and the KV block budget, the newest
// sequence preempted when blocks run out), and in a disaggregated deployment the store handoff
// between a prefill replica and a decode replica. Step times come from the profile's fitted
// StepModels, so the simulator predicts what `tandem bench` would measure against the same
// deployment, and the planner (planner.h) searches deployments with it.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/planner/profile.h"

namespace tandem::planner {

// One request of a given schedule: when it arrives (seconds, non-decreasing over the list),
// its prompt tokens and the tokens it generates.
struct SimRequest {
  double arrival = 0;
  int32_t prompt = 0;
  int32_t output = 0;
};

// Requests as `tandem bench` makes them: Poisson arrivals, prompt and output lengths uniform in
// [round(len * (1 - range)), round(len * (1 + range))] (at least 1), or a trace's; and the SLOs
// a request must meet to count as good (both TTFT and TPOT; 0: no bound).
struct Workload {
  int32_t input_len = 512;
  double input_len_range = 0;
  int32_t output_len = 128;
  double output_len_range = 0;
  int64_t num_requests = 1000;
  uint64_t seed = 1;
  double slo_ttft_s = 0;
  double slo_tpot_s = 0;
  double attainment = 0.9;  // the fraction of requests that must meet the SLOs
  // A trace (tandem bench --dataset with lengths): when not empty, its requests replace the
  // random ones, `num_requests` of them (the trace repeated end to end if shorter). With send
  // times, a simulation at rate R replays them scaled to R on average (ReplayArrivals), so
  // bursts keep their shape; without (every arrival 0), Poisson arrivals as above.
  std::vector<SimRequest> trace;
};

// `n` send times from a trace's (seconds, non-decreasing): the trace itself, repeated end to end
// when n is larger, each repeat one mean gap after the previous one's last.
std::vector<double> TileTimestamps(std::span<const double> timestamps, int64_t n);
// The trace's mean arrival rate, (count - 1) / span; 0 when it spans no time.
double TraceRate(std::span<const double> timestamps);
// A trace's send times from 0, stretched or compressed uniformly to `rate` requests/s on
// average; a rate of +inf, or a trace that spans no time, keeps the recorded gaps. `tandem
// bench` replays a timestamped dataset with it, and the simulator simulates the same times.
std::vector<double> ReplayArrivals(std::span<const double> timestamps, double rate);
// The send times of `n` requests of a trace recorded at `timestamps`, replayed at `rate`
// (TileTimestamps, then ReplayArrivals); empty when the trace spans no time, whose requests
// then arrive as a Poisson process. `tandem bench` and the simulator both take them from here.
std::vector<double> TraceSchedule(std::span<const double> timestamps, int64_t n, double rate);

// One engine's limits (engine::EngineOptions of the same names).
struct EngineLimits {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int chunk_size = 512;
  int64_t num_blocks = 0;  // KV blocks of the profile's block_size
  // scheduler.stream_interval: tokens per streamed message (each message costs the profile's
  // token_overhead_seconds); the first on an engine and the last go at once.
  int stream_interval = 1;
};

struct Deployment {
  bool disaggregated = false;
  int prefill_replicas = 0;       // disaggregated only
  int replicas = 1;               // colocated: every replica; disaggregated: decode replicas
  EngineLimits prefill;           // disaggregated only
  EngineLimits engine;            // colocated replicas, or the decode replicas
  std::string transport = "shm";  // the handoff's kv_transfer samples (disaggregated)

  std::string Describe() const;
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
  double mean = 0;  // what the router's WorkloadStats measures, for the advisor's fit
};

struct SimulationResult {
  double rate = 0;        // offered requests/s
  double attainment = 0;  // fraction of requests meeting both SLOs
  double duration_s = 0;  // first arrival to last token
  double throughput = 0;  // completed requests/s over duration_s
  double goodput = 0;     // requests meeting both SLOs per second of duration_s
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;  // prompt and output tokens
  Percentiles ttft, tpot;
  int64_t preemptions = 0;
  // Seconds the replicas spent in steps (overheads included), summed over the replicas of each
  // role: what the processes' CPU time is compared with (bench/serving/cpu_share.py).
  double prefill_busy_s = 0;  // disaggregated prefill replicas
  double engine_busy_s = 0;   // colocated replicas, or the decode replicas
};

// Simulates `workload.num_requests` requests arriving at `rate` per second. Deterministic for a
// given workload seed. InvalidArgument for a deployment that cannot run (no replicas, a KV
// budget smaller than one prompt, a handoff transport the profile did not measure).
absl::StatusOr<SimulationResult> Simulate(const EngineProfile& profile, const Deployment& d,
                                          const Workload& workload, double rate);

// Simulates exactly these requests (e.g. the ones `tandem bench` sends for a seed), judged by
// the workload's SLOs; `rate` is reported as the offered rate. Lengths and limits are checked
// as Simulate checks them.
absl::StatusOr<SimulationResult> SimulateRequests(const EngineProfile& profile, const Deployment& d,
                                                  const std::vector<SimRequest>& schedule,
                                                  const Workload& workload, double rate);

}  // namespace tandem::planner
