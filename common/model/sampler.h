#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem::model {

// Sampling parameters with the public API's defaults: temperature 0 = greedy, top_p 0 or 1 =
// off, top_k 0 = off, seed 0 = random.
struct SamplingParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;

  // InvalidArgument for temperature < 0 or top_p outside [0, 1] (or non-finite values).
  absl::Status Validate() const;
};

// Draws tokens for one sequence. Holds its own RNG so a sequence's tokens depend only on its
// seed and logits, never on what else shares the batch.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token from `logits` (vocab floats). Greedy picks the lowest index among
  // equal maxima.
  int32_t Sample(std::span<const float> logits);
  // Advances the RNG past `n` samples, as if Sample had run n times: a sequence resumed after
  // n generated tokens (migration) continues the stream it would have drawn. Each non-greedy
  // Sample takes exactly one draw.
  void Skip(int n);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused scratch
};

int32_t ArgMax(std::span<const float> logits);

}  // namespace tandem::model
