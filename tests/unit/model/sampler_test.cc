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

TEST(SamplerTest, ValidatesParameters) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.temperature = -0.1f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.temperature = NAN}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.top_p = 1.01f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.top_p = -0.5f}.Validate().ok());
  EXPECT_FALSE(SamplingParams{.top_k = -1}.Validate().ok());
}

}  // namespace
}  // namespace tandem::model
