#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::model {

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0 (0 = greedy), got ", temperature));
  }
  if (!std::isfinite(top_p) || top_p < 0 || top_p > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p must be in (0, 1] (0 = off), got ", top_p));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  return absl::OkStatus();
}

int32_t ArgMax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  uint64_t seed = params.seed;
  if (seed == 0)
    seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  rng_.seed(seed);
}

void Sampler::Skip(int n) {
  if (n > 0 && params_.temperature != 0.0f && params_.top_k != 1) rng_.discard(n);
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return ArgMax(logits);
  const int64_t vocab = static_cast<int64_t>(logits.size());
  candidates_.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) candidates_[i] = {logits[i], static_cast<int32_t>(i)};
  auto greater = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int64_t n = vocab;
  const bool use_top_p = params_.top_p > 0 && params_.top_p < 1;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(),
                      greater);
    n = params_.top_k;
  } else if (use_top_p) {
    std::sort(candidates_.begin(), candidates_.end(), greater);
  } else {
    // Plain temperature sampling needs no order: move the maximum to the front only.
    std::iter_swap(candidates_.begin(), candidates_.begin() + ArgMax(logits));
  }
  // Softmax over the kept candidates (the first is the maximum), with temperature.
  const float inv_t = 1.0f / params_.temperature;
  const float max = candidates_[0].first;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    candidates_[i].first = std::exp((candidates_[i].first - max) * inv_t);
    sum += candidates_[i].first;
  }
  if (use_top_p) {
    // Keep the smallest prefix whose probability mass reaches top_p.
    double mass = 0;
    int64_t keep = 0;
    while (keep < n) {
      mass += candidates_[keep++].first / sum;
      if (mass >= params_.top_p) break;
    }
    n = keep;
    sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += candidates_[i].first;
  }
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  for (int64_t i = 0; i < n; ++i) {
    r -= candidates_[i].first;
    if (r < 0) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

}  // namespace tandem::model
