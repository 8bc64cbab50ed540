#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

namespace tandem::model {

// Sampling parameters with the public API's defaults: temperature 0 = greedy, top_p 0 or 1 =
// off, top_k 0 = off, seed 0 = random, no penalties, no log-probabilities.
struct SamplingParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  bool seeded = false;  // `seed` as given, 0 included; else seed 0 draws a random seed
  // Penalties on tokens already seen, as vLLM and the OpenAI API define them, applied to the
  // logits before temperature: presence subtracts `presence_penalty` from the logit of every
  // token generated at least once, frequency subtracts `frequency_penalty` per time it was
  // generated; repetition (Hugging Face's) divides a positive logit, or multiplies a negative
  // one, by `repetition_penalty` for every token in the prompt or the output.
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  float repetition_penalty = 1.0f;  // > 0
  // >= 0: report the sampled token's log-probability and the `logprobs` most likely tokens'
  // (at most kMaxLogprobs); -1: none.
  int logprobs = -1;

  static constexpr int kMaxLogprobs = 20;

  bool has_penalties() const {
    return presence_penalty != 0 || frequency_penalty != 0 || repetition_penalty != 1;
  }
  // InvalidArgument naming the field for values out of range (or non-finite).
  absl::Status Validate() const;
};

// A sampled token's log-probability and the most likely alternatives', most likely first: the
// log-softmax of the logits after the penalties and temperature (temperature 0 counts as 1),
// before top-k and top-p.
struct TokenLogprobs {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob)
};

// Draws tokens for one sequence. Holds its own RNG so a sequence's tokens depend only on its
// seed and logits, never on what else shares the batch; and, with penalties, the counts of the
// tokens it has seen.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // The sequence so far: `tokens` (prompt, then the last `num_generated` of them generated
  // earlier). Needed only with penalties; call once, before the first Sample.
  void SetHistory(std::span<const int32_t> tokens, int num_generated);

  // Picks the next token from `logits` (vocab floats) and counts it as generated. Greedy picks
  // the lowest index among equal maxima. With params.logprobs >= 0 and `logprobs` given, fills
  // it.
  int32_t Sample(std::span<const float> logits, TokenLogprobs* logprobs = nullptr);
  // Advances the RNG past `n` samples, as if Sample had run n times: a sequence resumed after
  // n generated tokens (migration) continues the stream it would have drawn. Each non-greedy
  // Sample takes exactly one draw.
  void Skip(int n);

 private:
  // The logits after the penalties (a copy in scratch_ when there are any).
  std::span<const float> Penalized(std::span<const float> logits);
  int32_t Draw(std::span<const float> logits);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused scratch
  std::vector<float> scratch_;
  absl::flat_hash_map<int32_t, int> generated_;  // token -> times generated (penalties only)
  absl::flat_hash_set<int32_t> prompt_;          // tokens of the prompt (repetition only)
};

int32_t ArgMax(std::span<const float> logits);

// The log-softmax of logits / temperature (temperature 0 counts as 1) at `token`, and the `top`
// most likely tokens' (the lower id first among equals), into `out`. `scratch` is reused
// between calls.
void ComputeLogprobs(std::span<const float> logits, int32_t token, int top, float temperature,
                     std::vector<std::pair<float, int32_t>>& scratch, TokenLogprobs& out);

}  // namespace tandem::model
