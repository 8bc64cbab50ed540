#include "common/model/sampler.h"

#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::model {
namespace {

TEST(SamplerTest, GreedyTakesFirstMaximum) {
  Sampler s({});
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.Sample(logits), 1);
}

TEST(SamplerTest, TemperatureMatchesSoftmaxFrequencies) {
  // p = softmax([0, ln 2, ln 5]) = [1/8, 2/8, 5/8].
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};
  Sampler s({.temperature = 1.0f, .seed = 7});
  std::vector<int> counts(3);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits)];
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 8, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 8, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 5.0 / 8, 0.01);
}

TEST(SamplerTest, TopKAndTopPRestrictTheCandidates) {
  std::vector<float> logits = {1.0f, 4.0f, 3.0f, 2.0f, 0.0f};
  Sampler k2({.temperature = 5.0f, .top_k = 2, .seed = 1});
  std::set<int> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(k2.Sample(logits));
  EXPECT_EQ(seen, (std::set<int>{1, 2}));
  // Probabilities at T=1: ~[.032, .644, .237, .087, .012]; top_p 0.7 keeps {1, 2}.
  Sampler p({.temperature = 1.0f, .top_p = 0.7f, .seed = 2});
  seen.clear();
  for (int i = 0; i < 2000; ++i) seen.insert(p.Sample(logits));
  EXPECT_EQ(seen, (std::set<int>{1, 2}));
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f) * 3;
  auto draw = [&](uint64_t seed) {
    Sampler s({.temperature = 0.8f, .top_p = 0.9f, .seed = seed});
    std::vector<int> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.Sample(logits));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(SamplerTest, LogprobsAreTheLogSoftmaxAfterTemperature) {
  // p = softmax([0, ln 2, ln 5] / 0.5) = [1, 4, 25] / 30.
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};
  Sampler s({.temperature = 0.5f, .seed = 3, .logprobs = 2});
  TokenLogprobs lp;
  const int32_t token = s.Sample(logits, &lp);
  const double p[] = {1.0 / 30, 4.0 / 30, 25.0 / 30};
  EXPECT_NEAR(lp.logprob, std::log(p[token]), 1e-6);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_NEAR(lp.top[0].second, std::log(p[2]), 1e-6);
  EXPECT_EQ(lp.top[1].first, 1);
  // Greedy counts as temperature 1; logprobs 0 is the sampled token's alone.
  Sampler g({.logprobs = 0});
  EXPECT_EQ(g.Sample(logits, &lp), 2);
  EXPECT_NEAR(lp.logprob, std::log(5.0 / 8), 1e-6);
  EXPECT_TRUE(lp.top.empty());
}

TEST(SamplerTest, PenaltiesFollowVllm) {
  // Token 0 was in the prompt, token 1 generated twice, token 2 never seen.
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  const std::vector<int32_t> history = {0, 3, 1, 1};  // prompt {0, 3}, then 1, 1 generated
  auto greedy_after = [&](SamplingParams params) {
    params.logprobs = 3;
    Sampler s(params);
    s.SetHistory(history, 2);
    TokenLogprobs lp;
    s.Sample(logits, &lp);
    std::vector<float> out(4);
    for (const auto& [t, v] : lp.top) out[t] = v;
    return std::make_pair(lp, out);
  };
  // frequency 0.4 + presence 0.3 on token 1: 1.0 - 0.3 - 0.4 * 2 = -0.1; nothing else moves.
  auto [f, fv] = greedy_after({.presence_penalty = 0.3f, .frequency_penalty = 0.4f});
  const double z = std::exp(2.0) + std::exp(-0.1) + std::exp(0.5) + std::exp(-1.0);
  EXPECT_NEAR(fv[0], 2.0 - std::log(z), 1e-5);
  EXPECT_NEAR(fv[2], 0.5 - std::log(z), 1e-5);
  EXPECT_NEAR(f.top[2].second, -0.1 - std::log(z), 1e-5);  // token 1 fell to third
  EXPECT_EQ(f.top[2].first, 1);
  // repetition 2 on prompt and output tokens: 0 -> 1.0, 3 -> -2.0, 1 -> 0.5; 2 untouched.
  auto [r, rv] = greedy_after({.repetition_penalty = 2.0f});
  const double zr = std::exp(1.0) + std::exp(0.5) + std::exp(0.5) + std::exp(-2.0);
  EXPECT_NEAR(rv[0], 1.0 - std::log(zr), 1e-5);
  EXPECT_NEAR(r.logprob, 1.0 - std::log(zr), 1e-5);
}

TEST(SamplerTest, PenaltiesCountWhatTheSamplerGenerates) {
  // Two tokens with equal logits: frequency 0.5 makes greedy alternate between them.
  std::vector<float> logits = {1.0f, 1.0f};
  Sampler s({.frequency_penalty = 0.5f});
  s.SetHistory(std::vector<int32_t>{5}, 0);
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(s.Sample(logits));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 0, 1}));
}

TEST(SamplerTest, ValidatesParameters) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.temperature = -0.1f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.temperature = NAN}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.top_p = 1.01f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.presence_penalty = 2.5f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.frequency_penalty = -3.0f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.repetition_penalty = 0.0f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.logprobs = 21}.Validate().ok());
  EXPECT_TRUE(SamplingParams{.logprobs = 20}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.top_p = -0.5f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.top_k = -1}.Validate().ok());
}

}  // namespace
}  // namespace tandem::model
