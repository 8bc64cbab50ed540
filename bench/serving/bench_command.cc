#include "bench/serving/bench_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/serving/arrivals.h"
#include "bench/serving/bench_options.h"
#include "bench/serving/dataset.h"
#include "bench/serving/load_client.h"
#include "bench/serving/progress_bar.h"
#include "bench/serving/report.h"
#include "common/planner/simulator.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

absl::StatusOr<std::vector<BenchRequest>> RandomRequests(const BenchOptions& o,
                                                         const tandem::v1::ModelInfo* model) {
  RandomDatasetOptions r{.num_requests = o.num_requests,
                         .input_len = o.input_len,
                         .input_len_range = o.input_len_range,
                         .output_len = o.output_len,
                         .output_len_range = o.output_len_range,
                         .seed = o.seed};
  if (o.vocab_size.has_value()) {
    r.vocab_size = *o.vocab_size;
  } else if (model != nullptr && model->vocab_size() > 0) {
    r.vocab_size = model->vocab_size();
  } else {
    return absl::InvalidArgumentError(
        "--vocab-size is required: the server did not report its model's vocabulary size");
  }
  // The server would reject these one by one; say it once, naming the flags.
  int64_t longest = int64_t{MaxRandomLength(o.input_len, o.input_len_range)} +
                    MaxRandomLength(o.output_len, o.output_len_range);
  if (model != nullptr && model->context_length() > 0 && longest > model->context_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input-len and --output-len (with their ranges) allow ", longest,
        " tokens per request, more than the model's context length ", model->context_length()));
  }
  return MakeRandomDataset(r);
}

// The dataset's requests, with ids made for its length-only (trace) lines, and when its
// timestamps span some time their send times (else empty: Poisson arrivals).
absl::StatusOr<std::vector<BenchRequest>> DatasetRequests(const BenchOptions& o,
                                                          const tandem::v1::ModelInfo* model,
                                                          std::vector<double>& schedule) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<BenchRequest> lines, LoadJsonlDataset(o.dataset));
  std::vector<BenchRequest> requests =
      TakeRequests(lines, o.num_requests_set ? o.num_requests : static_cast<int64_t>(lines.size()));
  if (std::any_of(requests.begin(), requests.end(),
                  [](const BenchRequest& r) { return r.input_length > 0; })) {
    int32_t vocab = o.vocab_size.value_or(model != nullptr ? model->vocab_size() : 0);
    if (vocab <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.dataset,
                       ": lines with input_length need --vocab-size (the server did not report "
                       "its model's vocabulary size)"));
    }
    SynthesizePrompts(requests, vocab, o.seed);
  }
  if (HasTimestamps(lines)) {
    std::vector<double> recorded;
    for (const BenchRequest& r : lines) recorded.push_back(r.timestamp_s);
    schedule =
        planner::TraceSchedule(recorded, static_cast<int64_t>(requests.size()), o.request_rate);
  }
  return requests;
}

bool WantProgress(ProgressMode mode) {
  if (mode == ProgressMode::kAuto) return isatty(fileno(stderr)) != 0;
  return mode == ProgressMode::kOn;
}

RunDescription Describe(const BenchOptions& o, const tandem::v1::ModelInfo* model) {
  return RunDescription{.addr = o.addr,
                        .model = model != nullptr ? model->name() : "",
                        .dataset = o.dataset.empty() ? "random" : o.dataset,
                        .request_rate = o.request_rate,
                        .max_concurrency = o.max_concurrency,
                        .seed = o.seed,
                        .slo = o.slo};
}

}  // namespace

absl::Status RunBenchCommand(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(BenchOptions o, ParseBenchOptions(args));
  std::string ca_pem;
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFileToString(o.ca_file);
    if (!ca.ok())
      return absl::InvalidArgumentError(absl::StrCat("--ca-file: ", ca.status().message()));
    ca_pem = *std::move(ca);
  }
  LoadClient client(o.addr, o.connections, o.api,
                    o.api_key.empty() ? std::string() : "Bearer " + o.api_key, ca_pem);
  TANDEM_RETURN_IF_ERROR(client.Connect(std::min(o.timeout_s, 30.0)));
  absl::StatusOr<tandem::v1::ModelInfo> model = client.GetModelInfo(std::min(o.timeout_s, 30.0));
  if (!model.ok()) {
    // Only random prompts need the model; a server without GetModelInfo can still be measured.
    if (o.dataset.empty() && !o.vocab_size.has_value()) {
      return absl::Status(model.status().code(),
                          absl::StrCat("GetModelInfo on ", o.addr, ": ", model.status().message()));
    }
    std::fprintf(stderr, "tandem bench: GetModelInfo on %s failed (%s); continuing\n",
                 o.addr.c_str(), model.status().ToString().c_str());
  }
  const tandem::v1::ModelInfo* info = model.ok() ? &*model : nullptr;
  std::vector<double> schedule;
  std::vector<BenchRequest> requests;
  if (o.dataset.empty()) {
    TANDEM_ASSIGN_OR_RETURN(requests, RandomRequests(o, info));
  } else {
    TANDEM_ASSIGN_OR_RETURN(requests, DatasetRequests(o, info, schedule));
  }
  // A trace's send times, replayed (scaled to --request-rate if given), else Poisson arrivals.
  if (schedule.empty()) {
    schedule = BenchSchedule(static_cast<int64_t>(requests.size()), o.request_rate, o.seed);
  }

  LoadOptions load{.max_concurrency = o.max_concurrency, .timeout_s = o.timeout_s};
  ProgressBar bar(stderr);
  if (WantProgress(o.progress)) {
    load.on_progress = [&bar](const Progress& p, bool final) {
      final ? bar.Finish(p) : bar.Update(p);
    };
  }
  LoadResult result = client.Run(requests, schedule, load);

  BenchSummary summary = Summarize(result.records, result.duration_s, o.slo);
  RunDescription run = Describe(o, info);
  std::fputs(FormatTable(summary, run).c_str(), stdout);
  std::fflush(stdout);
  if (!o.json_out.empty()) TANDEM_RETURN_IF_ERROR(WriteJsonReport(o.json_out, summary, run));
  if (summary.completed == 0) {
    return absl::UnavailableError(absl::StrCat("all ", summary.num_requests,
                                               " requests failed; first: ", summary.first_error));
  }
  return absl::OkStatus();
}

}  // namespace tandem::bench
