// The prompts a benchmark sends: random token ids (vLLM's "random" dataset) or a JSON Lines
// file: text prompts, or a trace of prompt lengths and arrival times (Mooncake's format).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

// One request to send: either text (`prompt`) or token ids (`prompt_token_ids`), never both.
// A trace line gives only a length (`input_length`, and `hash_ids` naming its blocks):
// SynthesizePrompts makes its ids.
struct BenchRequest {
  std::string prompt{};
  std::vector<int32_t> prompt_token_ids{};
  int32_t max_tokens = 0;
  int32_t input_length = 0;          // a trace line's prompt tokens (0: not a length line)
  std::vector<uint64_t> hash_ids{};  // a trace line's prompt blocks, kTraceBlockTokens each
  double timestamp_s = -1;           // when the trace sent it, seconds; < 0: no timestamp
};

// Tokens a trace's hash id stands for, as Mooncake's traces define it.
inline constexpr int32_t kTraceBlockTokens = 512;

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

// Parses JSON Lines, one object per line: a prompt, either {"prompt": "<non-empty text>"} or
// {"input_length": N > 0} (tokens; optionally "hash_ids": [...], the ids of its blocks of
// kTraceBlockTokens, so that lines sharing leading ids share a prefix); the output, either
// "max_tokens" or "output_length" (N > 0); and optionally "timestamp", milliseconds from the
// start of the trace, on every line or none, never decreasing. A Mooncake trace line
// ({"timestamp", "input_length", "output_length", "hash_ids"}) is one. Blank lines are skipped,
// any other key is an error (a typo would otherwise be silently ignored). `source` names the
// input in errors, which read "SOURCE:LINE: ...".
absl::StatusOr<std::vector<BenchRequest>> ParseJsonlDataset(std::string_view text,
                                                            std::string_view source);

// Reads and parses `path`; an empty file is an error.
absl::StatusOr<std::vector<BenchRequest>> LoadJsonlDataset(const std::string& path);

// `num_requests` requests taken from `dataset` in order, wrapping around when it is shorter.
std::vector<BenchRequest> TakeRequests(const std::vector<BenchRequest>& dataset,
                                       int64_t num_requests);

// Whether the requests carry the trace's send times (ParseJsonlDataset makes it all or none).
bool HasTimestamps(const std::vector<BenchRequest>& requests);

// The prompt tokens of each request: its text's are not known here (nullopt for those).
std::optional<std::vector<int32_t>> PromptLengths(const std::vector<BenchRequest>& requests);

// Gives every length-only request (input_length) its token ids, uniform in [0, vocab_size):
// each hash id's block the same ids wherever it appears (so shared leading ids are a shared
// prefix the server can cache), the rest of a prompt ids of its own; deterministic for a seed.
void SynthesizePrompts(std::vector<BenchRequest>& requests, int32_t vocab_size, uint64_t seed);

}  // namespace tandem::bench
