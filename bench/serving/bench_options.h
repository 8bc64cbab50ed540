// The flags of `tandem bench`, parsed and validated into one options struct.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "bench/serving/latency_stats.h"
#include "common/util/cli_args.h"

namespace tandem::bench {

enum class ProgressMode { kAuto, kOn, kOff };  // kAuto: only when stderr is a terminal

struct BenchOptions {
  std::string addr;  // HOST:PORT of a tandem.v1.Inference server (api "http": an OpenAI one)
  std::string api = "grpc";  // grpc | http (POST /v1/completions, streamed)
  int64_t num_requests = 1000;
  // Requests/s of the Poisson arrivals; +infinity (the default) sends all at once.
  double request_rate = std::numeric_limits<double>::infinity();
  int64_t max_concurrency = 0;  // 0: unlimited
  uint64_t seed = 0;
  // Random prompts (when `dataset` is empty).
  int32_t input_len = 1024;
  double input_len_range = 0;
  int32_t output_len = 128;
  double output_len_range = 0;
  std::optional<int32_t> vocab_size;  // unset: GetModelInfo's
  // JSON Lines (dataset.h: text prompts, or a trace of lengths and send times);
  // `num_requests` defaults to its line count.
  std::string dataset;
  bool num_requests_set = false;
  double timeout_s = 600;
  Slo slo;
  std::string json_out;  // empty: no JSON file
  ProgressMode progress = ProgressMode::kAuto;
  int connections = 4;
  std::string api_key;  // empty: none
  std::string ca_file;  // empty: plaintext
};

// InvalidArgument naming the flag for unknown flags, malformed or out-of-range values and
// flags that do not go together (--dataset with the random-prompt flags).
absl::StatusOr<BenchOptions> ParseBenchOptions(const CliArgs& args);

}  // namespace tandem::bench
