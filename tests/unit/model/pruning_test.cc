#include "common/model/pruning.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "common/kv/kv_cache_manager.h"
#include "common/model/model.h"
#include "common/model/pruning_check.h"
#include "common/model/scratch_kv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::model {
namespace {

using ::testing::ElementsAre;

TEST(PrunedLayersTest, RangeFromStartWithEveryKthLayerKept) {
  EXPECT_THAT(PrunedLayers({.start_layer = 2, .keep_every = 2}, 6), ElementsAre(0, 0, 1, 0, 1, 0));
  EXPECT_THAT(PrunedLayers({.start_layer = 2, .keep_every = 0}, 6), ElementsAre(0, 0, 1, 1, 1, 1));
  EXPECT_THAT(PrunedLayers({.start_layer = 1, .keep_every = 3}, 6), ElementsAre(0, 1, 1, 0, 1, 1));
  EXPECT_THAT(PrunedLayers({.start_layer = 4, .keep_every = 1}, 6), ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(PrunedLayers({.start_layer = 6}, 6), ElementsAre(0, 0, 0, 0, 0, 0));
}

TEST(PrunedLayersTest, RatioPrunesTheLastLayersRounded) {
  EXPECT_EQ(StartLayerForRatio(1.0 / 3, 16), 11);  // 5.33 -> 5 layers
  EXPECT_EQ(StartLayerForRatio(0.25, 16), 12);
  EXPECT_EQ(StartLayerForRatio(0.5, 16), 8);
  EXPECT_EQ(StartLayerForRatio(0.0, 16), 16);
  EXPECT_EQ(StartLayerForRatio(1.0, 16), 0);
  EXPECT_EQ(StartLayerForRatio(1.0 / 3, 8), 5);  // 2.67 -> 3 layers
}

TEST(PrunedLayersTest, SettingsResolveStartOrRatioAndRefuseWhatPrunesNothing) {
  auto s = ResolvePruningSettings(/*start_layer=*/0, /*ratio=*/1.0 / 3, 2, 7, /*num_layers=*/24);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->start_layer, 16);
  EXPECT_EQ(s->keep_every, 2);
  EXPECT_EQ(s->protected_tokens, 7);
  s = ResolvePruningSettings(23, 0, 0, 0, 24);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->start_layer, 23);

  // The seed's start_layer 25 on a 24-layer model, read as 1-based or not, prunes nothing.
  s = ResolvePruningSettings(25, 0, 8, 100, 24);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("layers are 0..23"));
  EXPECT_FALSE(ResolvePruningSettings(24, 0, 0, 0, 24).ok());
  EXPECT_FALSE(ResolvePruningSettings(0, 0.01, 0, 0, 24).ok());  // rounds to no layer
  EXPECT_FALSE(ResolvePruningSettings(3, 0.5, 0, 0, 24).ok());   // both
  EXPECT_FALSE(ResolvePruningSettings(0, 1.5, 0, 0, 24).ok());
  EXPECT_FALSE(ResolvePruningSettings(0, std::nan(""), 0, 0, 24).ok());
  EXPECT_FALSE(ResolvePruningSettings(-1, 0, 0, 0, 24).ok());
  EXPECT_FALSE(ResolvePruningSettings(0, 0.5, -1, 0, 24).ok());
}

TEST(MarkProtectedTokensTest, MostFrequentIdsWinTiesGoToTheFirstSeen) {
  const std::vector<int32_t> prompt = {1, 5, 7, 5, 9, 7, 1, 1, 3, 5};
  std::vector<uint8_t> full(prompt.size(), 0);
  // Id 1 is BOS-like and excluded; 5 (3x) first, then 7 (2x).
  MarkProtectedTokens(prompt, 2, std::vector<int32_t>{1}, full);
  EXPECT_THAT(full, ElementsAre(0, 1, 1, 1, 0, 1, 0, 0, 0, 1));
  // 9 and 3 tie at one occurrence: 9 was seen first.
  std::fill(full.begin(), full.end(), 0);
  MarkProtectedTokens(prompt, 3, std::vector<int32_t>{1}, full);
  EXPECT_THAT(full, ElementsAre(0, 1, 1, 1, 1, 1, 0, 0, 0, 1));
  std::fill(full.begin(), full.end(), 0);
  MarkProtectedTokens(prompt, 0, {}, full);
  EXPECT_EQ(std::count(full.begin(), full.end(), 1), 0);
}

// Pruned forward passes of the tiny model, compared across batch shapes.
class PrunedForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = testing::TinySpec();
    spec.layers = 4;
    dir_ = testing::WriteTempModel(spec);
    ASSERT_FALSE(dir_.empty());
    auto m = Model::Load(dir_, pool_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    kv::KvCacheOptions o;
    o.layout = model_->config().KvLayoutFor(DType::kF32, 4);
    o.num_blocks = 64;
    o.model_id = dir_;
    o.enable_prefix_caching = false;
    auto kv = kv::KvCacheManager::Create(o);
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
  }

  std::vector<int32_t> Prompt(int len, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(len);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 16);  // few ids: repeats
    return p;
  }

  const int32_t* Table(int64_t id, const std::vector<int32_t>& prompt) {
    EXPECT_TRUE(kv_->AddSequence(id, prompt).ok());
    EXPECT_TRUE(kv_->Reserve(id, static_cast<int>(prompt.size())).ok());
    return kv_->BlockTableData(id);
  }

  ThreadPool pool_{2};
  std::string dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  const std::vector<uint8_t> pruned_ = PrunedLayers({.start_layer = 1, .keep_every = 2}, 4);
};

TEST_F(PrunedForwardTest, ChunkedAndBatchedPruningMatchOneCall) {
  const std::vector<int32_t> a = Prompt(24, 1), b = Prompt(9, 2);
  std::vector<uint8_t> full_a(a.size(), 0), full_b(b.size(), 0);
  full_a.back() = full_b.back() = 1;
  MarkProtectedTokens(a, 2, {}, full_a);
  std::vector<float> alone, logits;

  // a alone, in one call.
  ForwardSequence seq{a.data(), 24, 0, Table(1, a), LogitsMode::kLast};
  PruningPlan plan{pruned_, full_a};
  ASSERT_TRUE(model_->Forward({&seq, 1}, kv_->pool_base(), kv_->layout(), alone, &plan).ok());

  // a in two chunks (the second batched with b), each chunk with its share of the marks.
  ForwardSequence first{a.data(), 10, 0, Table(2, a), LogitsMode::kNone};
  PruningPlan plan1{pruned_, std::span<const uint8_t>(full_a).first(10)};
  ASSERT_TRUE(model_->Forward({&first, 1}, kv_->pool_base(), kv_->layout(), logits, &plan1).ok());
  const ForwardSequence batch[] = {
      {b.data(), 9, 0, Table(3, b), LogitsMode::kLast},
      {a.data() + 10, 14, 10, kv_->BlockTableData(2), LogitsMode::kLast}};
  std::vector<uint8_t> marks(full_b);
  marks.insert(marks.end(), full_a.begin() + 10, full_a.end());
  PruningPlan plan2{pruned_, marks};
  ASSERT_TRUE(model_->Forward(batch, kv_->pool_base(), kv_->layout(), logits, &plan2).ok());
  const int64_t vocab = model_->config().vocab_size;
  ASSERT_EQ(logits.size(), 2 * static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) EXPECT_NEAR(logits[vocab + i], alone[i], 1e-4) << i;

  // b alone gives what it gave in the batch.
  ForwardSequence seq_b{b.data(), 9, 0, Table(4, b), LogitsMode::kLast};
  PruningPlan plan_b{pruned_, full_b};
  std::vector<float> b_alone;
  ASSERT_TRUE(model_->Forward({&seq_b, 1}, kv_->pool_base(), kv_->layout(), b_alone, &plan_b).ok());
  for (int64_t i = 0; i < vocab; ++i) EXPECT_NEAR(logits[i], b_alone[i], 1e-4) << i;
}

TEST_F(PrunedForwardTest, PruningChangesLogitsUnlessEveryTokenOrNoLayerIsPruned) {
  const std::vector<int32_t> a = Prompt(20, 3);
  std::vector<float> plain, pruned, all_full, none_pruned;
  ForwardSequence s1{a.data(), 20, 0, Table(1, a), LogitsMode::kLast};
  ASSERT_TRUE(model_->Forward({&s1, 1}, kv_->pool_base(), kv_->layout(), plain).ok());

  std::vector<uint8_t> last_only(a.size(), 0);
  last_only.back() = 1;
  ForwardSequence s2{a.data(), 20, 0, Table(2, a), LogitsMode::kLast};
  PruningPlan plan{pruned_, last_only};
  ASSERT_TRUE(model_->Forward({&s2, 1}, kv_->pool_base(), kv_->layout(), pruned, &plan).ok());
  double moved = 0;
  for (size_t i = 0; i < plain.size(); ++i)
    moved = std::max(moved, double(std::fabs(plain[i] - pruned[i])));
  EXPECT_GT(moved, 1e-3);

  const std::vector<uint8_t> every(a.size(), 1);
  ForwardSequence s3{a.data(), 20, 0, Table(3, a), LogitsMode::kLast};
  PruningPlan full_plan{pruned_, every};
  ASSERT_TRUE(
      model_->Forward({&s3, 1}, kv_->pool_base(), kv_->layout(), all_full, &full_plan).ok());
  EXPECT_EQ(all_full, plain);

  const std::vector<uint8_t> no_layers(4, 0);
  ForwardSequence s4{a.data(), 20, 0, Table(4, a), LogitsMode::kLast};
  PruningPlan no_plan{no_layers, last_only};
  ASSERT_TRUE(
      model_->Forward({&s4, 1}, kv_->pool_base(), kv_->layout(), none_pruned, &no_plan).ok());
  EXPECT_EQ(none_pruned, plain);
}

TEST_F(PrunedForwardTest, PlanOfTheWrongSizeIsInvalidArgument) {
  const std::vector<int32_t> a = Prompt(8, 4);
  ForwardSequence s{a.data(), 8, 0, Table(1, a), LogitsMode::kLast};
  const std::vector<uint8_t> marks(7, 1), layers(3, 1);
  std::vector<float> logits;
  PruningPlan short_marks{pruned_, marks};
  EXPECT_EQ(model_->Forward({&s, 1}, kv_->pool_base(), kv_->layout(), logits, &short_marks).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint8_t> ok_marks(8, 1);
  PruningPlan short_layers{layers, ok_marks};
  EXPECT_EQ(model_->Forward({&s, 1}, kv_->pool_base(), kv_->layout(), logits, &short_layers).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PrunedForwardTest, AttentionStabilityIsOneWhereNothingDiffers) {
  const std::vector<int32_t> prompt = Prompt(40, 7);
  // Layers 1..3 pruned: layer 1 sees the same input and cache either way; later ones do not.
  auto s = CheckAttentionStability(*model_, prompt, {.start_layer = 1}, DType::kF32);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ((*s)[0].layer, 1);
  EXPECT_NEAR((*s)[0].cosine, 1.0, 1e-6);
  EXPECT_LT(std::min((*s)[1].cosine, (*s)[2].cosine), 1.0 - 1e-4);
  for (const auto& l : *s) EXPECT_GT(l.cosine, -1.0 - 1e-9);

  // Protecting all 16 ids keeps every position at full depth: nothing can differ.
  s = CheckAttentionStability(*model_, prompt, {.start_layer = 1, .protected_tokens = 16},
                              DType::kF32);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const auto& l : *s) EXPECT_NEAR(l.cosine, 1.0, 1e-6) << "layer " << l.layer;
  EXPECT_FALSE(CheckAttentionStability(*model_, {}, {.start_layer = 1}, DType::kF32).ok());
}

// A runner given each piece (a turn on a shared pool, in a worker) sees every piece, in order,
// and the result is the same as without one.
TEST_F(PrunedForwardTest, AttentionStabilityRunsEachPieceThroughTheRunner) {
  const std::vector<int32_t> prompt = Prompt(40, 7);
  auto direct = CheckAttentionStability(*model_, prompt, {.start_layer = 1}, DType::kF32, 16);
  ASSERT_TRUE(direct.ok()) << direct.status();
  int pieces = 0;
  auto run = [&pieces](const std::function<absl::Status()>& forward) {
    ++pieces;
    return forward();
  };
  auto via = CheckAttentionStability(*model_, prompt, {.start_layer = 1}, DType::kF32, 16, run);
  ASSERT_TRUE(via.ok()) << via.status();
  EXPECT_EQ(pieces, 2 * 3);  // two prefills of 40 tokens in pieces of 16
  ASSERT_EQ(via->size(), direct->size());
  for (size_t i = 0; i < via->size(); ++i) EXPECT_EQ((*via)[i].cosine, (*direct)[i].cosine);
  // A runner's error is the check's.
  auto failing = [](const std::function<absl::Status()>&) {
    return absl::UnavailableError("no turn");
  };
  EXPECT_EQ(CheckAttentionStability(*model_, prompt, {.start_layer = 1}, DType::kF32, 16, failing)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(PrunedForwardTest, ResidualGatesScaleTheBranches) {
  const std::vector<int32_t> prompt = Prompt(12, 3);
  auto run = [&](std::vector<float> gates) {
    ScratchKv kv(*model_, DType::kF32, 16);
    ForwardProbe probe;
    probe.residual_gates = std::move(gates);
    EXPECT_TRUE(kv.Forward(prompt.data(), 12, 0, LogitsMode::kLast, nullptr, &probe).ok());
    return kv.logits();
  };
  const std::vector<float> base = run({}), ones = run({1, 1, 1, 1}), off = run({1, 1, 1, 0});
  EXPECT_EQ(base, ones);
  EXPECT_NE(base, off);
  ScratchKv kv(*model_, DType::kF32, 16);
  ForwardProbe wrong;
  wrong.residual_gates = {1, 1};
  EXPECT_EQ(kv.Forward(prompt.data(), 12, 0, LogitsMode::kLast, nullptr, &wrong).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::model
