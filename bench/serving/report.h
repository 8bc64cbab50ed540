// The benchmark report: a table for people (stdout) and JSON for scripts (--json-out).
#pragma once

#include <cstdint>
#include <string>

#include "bench/serving/latency_stats.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {

// What was run, echoed in the report so a result file stands on its own.
struct RunDescription {
  std::string addr{};
  std::string model{};          // GetModelInfo's name; empty when unknown
  std::string dataset{};        // "random" or the --dataset path
  double request_rate = 0;      // +infinity: all at once
  int64_t max_concurrency = 0;  // 0: unlimited
  uint64_t seed = 0;
  Slo slo{};
};

std::string FormatTable(const BenchSummary& summary, const RunDescription& run);

nlohmann::json ToJson(const BenchSummary& summary, const RunDescription& run);

// Writes ToJson (indented) to `path`.
absl::Status WriteJsonReport(const std::string& path, const BenchSummary& summary,
                             const RunDescription& run);

}  // namespace tandem::bench
