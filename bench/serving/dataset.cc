#include "bench/serving/dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util/file_util.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

// Uniform integer in [lo, hi] from the raw generator (std::uniform_int_distribution differs
// between standard libraries; this does not). The modulo bias is below 2^-40 for these ranges.
int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(rng() % span);
}

int32_t MinRandomLength(int32_t len, double range) {
  return std::max<int32_t>(1, static_cast<int32_t>(std::lround(len * (1.0 - range))));
}

int32_t DrawLength(std::mt19937_64& rng, int32_t len, double range) {
  return static_cast<int32_t>(
      UniformInt(rng, MinRandomLength(len, range), MaxRandomLength(len, range)));
}

absl::StatusOr<BenchRequest> ParseLine(std::string_view line, const std::string& where) {
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json object, ParseJsonObject(line, where));
  for (const auto& [key, value] : object.items()) {
    if (key != "prompt" && key != "max_tokens") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown key \"", key, "\" (expected \"prompt\", \"max_tokens\")"));
    }
  }
  JsonFields fields(object, where);
  BenchRequest request;
  TANDEM_ASSIGN_OR_RETURN(request.prompt, fields.String("prompt"));
  if (request.prompt.empty()) return fields.Error("prompt", "is empty");
  TANDEM_ASSIGN_OR_RETURN(int64_t max_tokens,
                          fields.Int("max_tokens", 1, std::numeric_limits<int32_t>::max()));
  request.max_tokens = static_cast<int32_t>(max_tokens);
  return request;
}

}  // namespace

int32_t MaxRandomLength(int32_t len, double range) {
  return std::max<int32_t>(1, static_cast<int32_t>(std::lround(len * (1.0 + range))));
}

std::vector<BenchRequest> MakeRandomDataset(const RandomDatasetOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::vector<BenchRequest> requests(
      static_cast<size_t>(std::max<int64_t>(options.num_requests, 0)));
  for (BenchRequest& request : requests) {
    int32_t input_len = DrawLength(rng, options.input_len, options.input_len_range);
    request.max_tokens = DrawLength(rng, options.output_len, options.output_len_range);
    request.prompt_token_ids.resize(static_cast<size_t>(input_len));
    for (int32_t& id : request.prompt_token_ids) {
      id = static_cast<int32_t>(UniformInt(rng, 0, options.vocab_size - 1));
    }
  }
  return requests;
}

absl::StatusOr<std::vector<BenchRequest>> ParseJsonlDataset(std::string_view text,
                                                            std::string_view source) {
  std::vector<BenchRequest> requests;
  int line_number = 0;
  for (absl::string_view piece :
       absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    std::string_view line(piece.data(), piece.size());
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    TANDEM_ASSIGN_OR_RETURN(BenchRequest request,
                            ParseLine(line, absl::StrCat(std::string(source), ":", line_number)));
    requests.push_back(std::move(request));
  }
  if (requests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": no requests (the file is empty)"));
  }
  return requests;
}

absl::StatusOr<std::vector<BenchRequest>> LoadJsonlDataset(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseJsonlDataset(text, path);
}

std::vector<BenchRequest> TakeRequests(const std::vector<BenchRequest>& dataset,
                                       int64_t num_requests) {
  std::vector<BenchRequest> out;
  if (dataset.empty()) return out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(num_requests, 0)));
  for (int64_t i = 0; i < num_requests; ++i) out.push_back(dataset[i % dataset.size()]);
  return out;
}

}  // namespace tandem::bench
