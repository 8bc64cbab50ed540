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
  for (const auto& [name, v] : {std::pair<const char*, float>{"presence_penalty", presence_penalty},
                                {"frequency_penalty", frequency_penalty}}) {
    if (!std::isfinite(v) || v < -2 || v > 2) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be in [-2, 2], got ", v));
    }
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0 (1 = off), got ", repetition_penalty));
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", logprobs));
  }
  return absl::OkStatus();
}

int32_t ArgMax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  uint64_t seed = params.seed;
  if (seed == 0 && !params.seeded) {
    seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  rng_.seed(seed);
}

void Sampler::Skip(int n) {
  if (n > 0 && params_.temperature != 0.0f && params_.top_k != 1) rng_.discard(n);
}

void Sampler::SetHistory(std::span<const int32_t> tokens, int num_generated) {
  if (!params_.has_penalties()) return;
  const size_t prompt = tokens.size() - std::min<size_t>(tokens.size(), num_generated);
  if (params_.repetition_penalty != 1) prompt_.insert(tokens.begin(), tokens.begin() + prompt);
  for (size_t i = prompt; i < tokens.size(); ++i) ++generated_[tokens[i]];
}

std::span<const float> Sampler::Penalized(std::span<const float> logits) {
  if (!params_.has_penalties()) return logits;
  scratch_.assign(logits.begin(), logits.end());
  const float rp = params_.repetition_penalty;
  auto repeat = [&](int32_t t) {
    float& l = scratch_[t];
    l = l > 0 ? l / rp : l * rp;
  };
  if (rp != 1) {
    for (int32_t t : prompt_) {
      if (t >= 0 && t < static_cast<int32_t>(scratch_.size())) repeat(t);
    }
  }
  for (const auto& [t, n] : generated_) {
    if (t < 0 || t >= static_cast<int32_t>(scratch_.size())) continue;
    if (rp != 1 && !prompt_.contains(t)) repeat(t);  // once per token, prompt or output
    scratch_[t] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(n);
  }
  return scratch_;
}

int32_t Sampler::Sample(std::span<const float> logits, TokenLogprobs* logprobs) {
  const std::span<const float> processed = Penalized(logits);
  const int32_t token = Draw(processed);
  if (logprobs != nullptr && params_.logprobs >= 0) {
    ComputeLogprobs(processed, token, params_.logprobs, params_.temperature, candidates_,
                    *logprobs);
  }
  if (params_.has_penalties()) ++generated_[token];
  return token;
}

void ComputeLogprobs(std::span<const float> logits, int32_t token, int top, float temperature,
                     std::vector<std::pair<float, int32_t>>& scratch, TokenLogprobs& out) {
  // log softmax(l / T) = l / T - max - log sum exp(l / T - max), in double for the sum.
  const double inv_t = temperature > 0 ? 1.0 / temperature : 1.0;
  const float max = logits[ArgMax(logits)];
  double sum = 0;
  for (float l : logits) sum += std::exp((static_cast<double>(l) - max) * inv_t);
  const double log_sum = std::log(sum);
  auto logprob = [&](int32_t t) {
    return static_cast<float>((static_cast<double>(logits[t]) - max) * inv_t - log_sum);
  };
  out.logprob = logprob(token);
  out.top.clear();
  const int k = std::min<int>(top, static_cast<int>(logits.size()));
  if (k <= 0) return;
  scratch.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) scratch[i] = {logits[i], static_cast<int32_t>(i)};
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(),
                    [](const auto& a, const auto& b) {
                      return a.first > b.first || (a.first == b.first && a.second < b.second);
                    });
  for (int i = 0; i < k; ++i) out.top.emplace_back(scratch[i].second, logprob(scratch[i].second));
}

int32_t Sampler::Draw(std::span<const float> logits) {
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
