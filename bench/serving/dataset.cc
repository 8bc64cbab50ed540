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

constexpr int64_t kMaxLength = 1 << 24;   // tokens of a prompt or an output
constexpr size_t kMaxHashIds = 1 << 16;   // blocks of a trace line
constexpr double kMaxTimestampMs = 1e12;  // ~30 years

// One of two keys naming the same thing: exactly one must be there.
absl::StatusOr<std::string_view> OneOf(const JsonFields& fields, std::string_view where,
                                       std::string_view a, std::string_view b) {
  if (fields.Has(a) == fields.Has(b)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(where), ": give exactly one of \"",
                                                   std::string(a), "\" and \"", std::string(b),
                                                   "\""));
  }
  return fields.Has(a) ? a : b;
}

absl::StatusOr<BenchRequest> ParseLine(std::string_view line, const std::string& where) {
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json object, ParseJsonObject(line, where));
  for (const auto& [key, value] : object.items()) {
    if (key != "prompt" && key != "max_tokens" && key != "input_length" && key != "output_length" &&
        key != "hash_ids" && key != "timestamp") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown key \"", key,
          "\" (expected \"prompt\" or \"input_length\", \"max_tokens\" or \"output_length\", "
          "\"hash_ids\", \"timestamp\")"));
    }
  }
  JsonFields fields(object, where);
  BenchRequest request;
  TANDEM_ASSIGN_OR_RETURN(std::string_view prompt_key,
                          OneOf(fields, where, "prompt", "input_length"));
  if (prompt_key == "prompt") {
    TANDEM_ASSIGN_OR_RETURN(request.prompt, fields.String("prompt"));
    if (request.prompt.empty()) return fields.Error("prompt", "is empty");
    if (fields.Has("hash_ids")) return fields.Error("hash_ids", "needs input_length, not prompt");
  } else {
    TANDEM_ASSIGN_OR_RETURN(int64_t n, fields.Int("input_length", 1, kMaxLength));
    request.input_length = static_cast<int32_t>(n);
  }
  if (fields.Has("hash_ids")) {
    const nlohmann::json& ids = object["hash_ids"];
    if (!ids.is_array() || ids.size() > kMaxHashIds) {
      return fields.Error("hash_ids", absl::StrCat("must be an array of at most ", kMaxHashIds,
                                                   " non-negative integers"));
    }
    for (const nlohmann::json& id : ids) {
      if (!id.is_number_unsigned()) {
        return fields.Error("hash_ids", "must hold non-negative integers");
      }
      request.hash_ids.push_back(id.get<uint64_t>());
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::string_view output_key,
                          OneOf(fields, where, "max_tokens", "output_length"));
  TANDEM_ASSIGN_OR_RETURN(int64_t max_tokens, fields.Int(output_key, 1, kMaxLength));
  request.max_tokens = static_cast<int32_t>(max_tokens);
  if (fields.Has("timestamp")) {
    TANDEM_ASSIGN_OR_RETURN(double ms, fields.Number("timestamp", 0, kMaxTimestampMs));
    request.timestamp_s = ms / 1e3;
  }
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
    const std::string where = absl::StrCat(std::string(source), ":", line_number);
    TANDEM_ASSIGN_OR_RETURN(BenchRequest request, ParseLine(line, where));
    if (!requests.empty() && (request.timestamp_s < 0) != (requests.back().timestamp_s < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"timestamp\" must be on every line or on none"));
    }
    if (!requests.empty() && request.timestamp_s < requests.back().timestamp_s) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"timestamp\" goes back in time (the trace must be in order)"));
    }
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

bool HasTimestamps(const std::vector<BenchRequest>& requests) {
  return !requests.empty() && requests.front().timestamp_s >= 0;
}

std::optional<std::vector<int32_t>> PromptLengths(const std::vector<BenchRequest>& requests) {
  std::vector<int32_t> lengths;
  lengths.reserve(requests.size());
  for (const BenchRequest& r : requests) {
    if (!r.prompt.empty()) return std::nullopt;
    lengths.push_back(r.input_length > 0 ? r.input_length
                                         : static_cast<int32_t>(r.prompt_token_ids.size()));
  }
  return lengths;
}

void SynthesizePrompts(std::vector<BenchRequest>& requests, int32_t vocab_size, uint64_t seed) {
  constexpr uint64_t kBlockSalt = 0x9e3779b97f4a7c15ull, kLineSalt = 0xc2b2ae3d27d4eb4full;
  for (size_t line = 0; line < requests.size(); ++line) {
    BenchRequest& r = requests[line];
    if (r.input_length <= 0 || !r.prompt_token_ids.empty()) continue;
    r.prompt_token_ids.reserve(static_cast<size_t>(r.input_length));
    for (uint64_t id : r.hash_ids) {
      if (std::ssize(r.prompt_token_ids) >= r.input_length) break;
      std::mt19937_64 block(seed ^ (id * kBlockSalt));
      for (int32_t i = 0; i < kTraceBlockTokens && std::ssize(r.prompt_token_ids) < r.input_length;
           ++i) {
        r.prompt_token_ids.push_back(static_cast<int32_t>(UniformInt(block, 0, vocab_size - 1)));
      }
    }
    std::mt19937_64 own(seed ^ ((line + 1) * kLineSalt));
    while (std::ssize(r.prompt_token_ids) < r.input_length) {
      r.prompt_token_ids.push_back(static_cast<int32_t>(UniformInt(own, 0, vocab_size - 1)));
    }
  }
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
