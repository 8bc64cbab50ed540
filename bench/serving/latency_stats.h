// Turns per-request records into the figures a serving benchmark reports: latency
// distributions (TTFT, TPOT, ITL, E2E), throughputs, goodput and failures by status code.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/serving/request_record.h"

namespace tandem::bench {

// The p-th percentile (0 <= p <= 100) of `sorted` (ascending, non-empty) by linear
// interpolation between closest ranks: rank = p/100 * (n - 1), as numpy.percentile's default
// ("linear") and vLLM's report.
double Percentile(const std::vector<double>& sorted, double p);

// A latency distribution in milliseconds. All zero when `count` is 0.
struct Distribution {
  int64_t count = 0;
  double mean_ms = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

// Summarizes values given in seconds.
Distribution Summarize(std::vector<double> seconds);

// Service-level objectives for goodput; unset ones are not checked.
struct Slo {
  std::optional<double> ttft_ms{};
  std::optional<double> tpot_ms{};
  bool any() const { return ttft_ms.has_value() || tpot_ms.has_value(); }
};

// True when a successful request meets every set SLO. A request with at most one completion
// token has no TPOT and meets any TPOT objective.
bool MeetsSlo(const RequestRecord& record, const Slo& slo);

// Time per output token after the first: (e2e - ttft) / (completion_tokens - 1); nullopt for
// fewer than two completion tokens or a request with no token.
std::optional<double> TpotSeconds(const RequestRecord& record);

struct BenchSummary {
  int64_t num_requests = 0;  // sent
  int64_t completed = 0;     // ended OK with a Complete
  int64_t failed = 0;
  // Failed requests per status code name ("RESOURCE_EXHAUSTED", ...).
  std::map<std::string, int64_t> failures_by_code;
  std::string first_error;  // "CODE: message" of the earliest-sent failure, for the report
  double duration_s = 0;    // start of the run to the end of the last request
  // Token totals over completed requests, from Complete.usage.
  int64_t total_prompt_tokens = 0;
  int64_t total_completion_tokens = 0;
  double request_throughput = 0;      // completed requests / duration
  double output_throughput = 0;       // completion tokens / duration
  double total_token_throughput = 0;  // (prompt + completion tokens) / duration
  // Latencies over completed requests (ITL over every gap of every completed request).
  Distribution ttft;
  Distribution tpot;
  Distribution itl;
  Distribution e2e;
  // How late requests left compared with the schedule (sender lag, plus waits for a slot
  // under --max-concurrency): a check that the load generator kept up.
  Distribution send_delay;
  // Set when the Slo has an objective: completed requests meeting it, and those per second.
  std::optional<int64_t> good_requests;
  std::optional<double> goodput;
};

// `duration_s` is the wall time of the whole run.
BenchSummary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                       const Slo& slo);

// "RESOURCE_EXHAUSTED" for absl::StatusCode::kResourceExhausted, as gRPC spells its codes.
std::string StatusCodeName(absl::StatusCode code);

}  // namespace tandem::bench
