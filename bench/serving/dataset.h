// The prompts a benchmark sends: random token ids (vLLM's "random" dataset) or a JSON Lines
// file of text prompts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

// One request to send: either text (`prompt`) or token ids (`prompt_token_ids`), never both.
struct BenchRequest {
  std::string prompt{};
  std::vector<int32_t> prompt_token_ids{};
  int32_t max_tokens = 0;
};

struct RandomDatasetOptions {
  int64_t num_requests = 0;
  // Lengths are uniform integers in [round(len * (1 - range)), round(len * (1 + range))],
  // at least 1, as vLLM's --random-range-ratio; range 0 gives exactly `len`.
  int32_t input_len = 0;
  double input_len_range = 0;
  int32_t output_len = 0;
  double output_len_range = 0;
  int32_t vocab_size = 0;  // ids are uniform in [0, vocab_size)
  uint64_t seed = 0;
};

// Deterministic for a given seed. Every prompt is drawn independently, so prompts share no
// prefix beyond chance and the server's prefix cache does not flatter the numbers.
std::vector<BenchRequest> MakeRandomDataset(const RandomDatasetOptions& options);

// The largest length MakeRandomDataset can draw for `len` and `range`.
int32_t MaxRandomLength(int32_t len, double range);

// Parses JSON Lines: one object per line, {"prompt": "<non-empty text>", "max_tokens": N > 0};
// blank lines are skipped, any other key is an error (a typo would otherwise be silently
// ignored). `source` names the input in errors, which read "SOURCE:LINE: ...".
absl::StatusOr<std::vector<BenchRequest>> ParseJsonlDataset(std::string_view text,
                                                            std::string_view source);

// Reads and parses `path`; an empty file is an error.
absl::StatusOr<std::vector<BenchRequest>> LoadJsonlDataset(const std::string& path);

// `num_requests` requests taken from `dataset` in order, wrapping around when it is shorter.
std::vector<BenchRequest> TakeRequests(const std::vector<BenchRequest>& dataset,
                                       int64_t num_requests);

}  // namespace tandem::bench
