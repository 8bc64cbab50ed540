// Quantize-on-load (model.weight_quantization): a quantized model computes what a float model
// holding the dequantized weights computes, for every architecture and format.

#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/kernels/cpu/gemm.h"
#include "common/model/model.h"
#include "common/model/scratch_kv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::model {
namespace {

using make_random_model::Arch;
using ::testing::HasSubstr;

// A float (f32, row-major) copy of `q`'s weights, every matrix as ReadRow gives it: the
// quantized matrices dequantized.
class DenseCopy {
 public:
  explicit DenseCopy(const ModelWeights& q) : weights_(std::make_unique<ModelWeights>()) {
    ModelWeights& w = *weights_;
    w.dtype = DType::kF32;
    w.embed_tokens = Dense(q.embed_tokens);
    w.lm_head = q.lm_head.data == q.embed_tokens.data ? w.embed_tokens : Dense(q.lm_head);
    w.final_norm = q.final_norm;
    for (const LayerWeights& l : q.layers) {
      LayerWeights d = l;
      for (auto [from, to] : {std::pair{&l.q_proj, &d.q_proj},
                              {&l.k_proj, &d.k_proj},
                              {&l.v_proj, &d.v_proj},
                              {&l.o_proj, &d.o_proj},
                              {&l.gate_proj, &d.gate_proj},
                              {&l.up_proj, &d.up_proj},
                              {&l.down_proj, &d.down_proj}}) {
        *to = Dense(*from);
      }
      w.layers.push_back(std::move(d));
    }
  }

  std::unique_ptr<ModelWeights> Take() { return std::move(weights_); }

 private:
  kernels::WeightMatrix Dense(const kernels::WeightMatrix& m) {
    auto& data = buffers_.emplace_back(m.rows * m.cols);
    for (int64_t r = 0; r < m.rows; ++r) kernels::ReadRow(m, r, data.data() + r * m.cols);
    return {data.data(), DType::kF32, m.rows, m.cols};
  }

  std::unique_ptr<ModelWeights> weights_;
  // Outlive the model (a static store is simplest: one test binary, a few KiB per model).
  static inline std::vector<std::vector<float>> buffers_;
};

std::vector<int32_t> Prompt(int len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

double StdDev(const std::vector<float>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double sq = 0;
  for (float x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / v.size());
}

// Logits of every position of `prompt`, run as one prefill then token by token.
std::vector<float> Logits(Model& model, const std::vector<int32_t>& prompt, int prefill) {
  ScratchKv kv(model, DType::kF32, static_cast<int64_t>(prompt.size()));
  std::vector<float> out;
  EXPECT_TRUE(kv.Forward(prompt.data(), prefill, 0, LogitsMode::kAll, nullptr).ok());
  out = kv.logits();
  for (size_t i = prefill; i < prompt.size(); ++i) {
    EXPECT_TRUE(
        kv.Forward(prompt.data() + i, 1, static_cast<int64_t>(i), LogitsMode::kAll, nullptr).ok());
    out.insert(out.end(), kv.logits().begin(), kv.logits().end());
  }
  return out;
}

struct Case {
  Arch arch;
  kernels::QuantFormat format;
  kernels::QuantFormat lm_head{};  // model.lm_head_quantization
};

TEST(QuantizedModelTest, ComputesTheDequantizedModel) {
  const kernels::QuantFormat int8_head{8, -1, false};
  // (Qwen2's models here tie lm_head to the embedding; the others do not.)
  const Case cases[] = {{Arch::kLlama, {8, -1, false}},
                        {Arch::kQwen2, {8, -1, false}},
                        {Arch::kQwen3, {4, 32, false}},
                        {Arch::kMistral, {4, 32, false}},
                        {Arch::kLlama, {4, -1, false}},
                        {Arch::kQwen2, {4, 16, false}},
                        {Arch::kQwen2, {4, 32, false}, int8_head},
                        {Arch::kLlama, {}, int8_head}};
  ThreadPool pool(2);
  for (const Case& c : cases) {
    auto spec = testing::TinySpec(c.arch);
    spec.dtype = DType::kBF16;
    spec.tie_embeddings = c.arch == Arch::kQwen2;
    const std::string dir = testing::WriteTempModel(spec);
    for (WeightMemory memory : {WeightMemory::kHugePages, WeightMemory::kMmap}) {
      const std::string name = LoadedQuantizationName({}, c.format, c.lm_head);
      SCOPED_TRACE(::testing::Message()
                   << dir << " " << name << " hugepages=" << (memory == WeightMemory::kHugePages));
      auto quantized = Model::Load(
          dir, pool, {.memory = memory, .quantize = c.format, .lm_head_quantize = c.lm_head});
      ASSERT_TRUE(quantized.ok()) << quantized.status();
      const ModelWeights& qw = (*quantized)->weights();
      const bool layers = c.format.bits != 0;
      EXPECT_EQ(qw.layers[1].down_proj.layout == kernels::WeightLayout::kQuantPanels, layers);
      if (layers) EXPECT_EQ(qw.layers[0].q_proj.quant, c.format);
      EXPECT_NE(qw.embed_tokens.layout, kernels::WeightLayout::kQuantPanels);
      if (c.lm_head.bits != 0) {
        ASSERT_EQ(qw.lm_head.layout, kernels::WeightLayout::kQuantPanels);
        EXPECT_EQ(qw.lm_head.quant, c.lm_head);
        EXPECT_NE(qw.lm_head.data, qw.embed_tokens.data);  // a tied head: a quantized copy
      } else {
        EXPECT_NE(qw.lm_head.layout, kernels::WeightLayout::kQuantPanels);
      }
      EXPECT_EQ(qw.format(), name);
      if (layers) EXPECT_LT(qw.memory_bytes, qw.total_bytes);

      auto config = ModelConfig::FromDirectory(dir);
      ASSERT_TRUE(config.ok());
      Model dense(*config, DenseCopy(qw).Take(), pool);
      auto original = Model::Load(dir, pool);
      ASSERT_TRUE(original.ok());

      const std::vector<int32_t> prompt = Prompt(21, static_cast<int>(spec.vocab), 3);
      const std::vector<float> q = Logits(**quantized, prompt, 13);
      const std::vector<float> d = Logits(dense, prompt, 13);
      const std::vector<float> f = Logits(**original, prompt, 13);
      ASSERT_EQ(q.size(), d.size());
      const double tolerance = 1e-3 * StdDev(d);
      double quantization_error = 0;
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_NEAR(q[i], d[i], tolerance) << "logit " << i;
        quantization_error = std::max<double>(quantization_error, std::abs(q[i] - f[i]));
      }
      // The reference is not the float model itself: quantizing moved the logits.
      EXPECT_GT(quantization_error, tolerance);
    }
  }
}

// Prefill, decode and batches take different kernel paths over quantized panels; each position's
// logits are the same whichever way it was computed, also with int8 activations (the integer
// kernels where the CPU has AVX512-VNNI).
TEST(QuantizedModelTest, LogitsDoNotDependOnHowThePromptIsSplit) {
  ThreadPool pool(2);
  auto spec = testing::TinySpec(Arch::kLlama);
  spec.dtype = DType::kBF16;
  const std::string dir = testing::WriteTempModel(spec);
  const kernels::QuantFormat a8{4, 32, false, true, kActivationBlock};
  const struct {
    kernels::QuantFormat layers, lm_head;
  } formats[] = {{{4, 32}, {}},
                 {a8, {}},
                 {{8, -1, true, true, kActivationBlock}, {}},
                 {a8, *ParseLmHeadQuantization("int8", a8)},
                 {{}, *ParseLmHeadQuantization("int8", {})}};
  for (const auto& [f, head] : formats) {
    SCOPED_TRACE(LoadedQuantizationName({}, f, head));
    auto model = Model::Load(
        dir, pool, {.memory = WeightMemory::kHugePages, .quantize = f, .lm_head_quantize = head});
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<int32_t> prompt = Prompt(56, static_cast<int>(spec.vocab), 5);
    const std::vector<float> whole = Logits(**model, prompt, 56);  // 56 rows convert to f32
    EXPECT_EQ(Logits(**model, prompt, 1), whole);
    EXPECT_EQ(Logits(**model, prompt, 30), whole);
  }
}

TEST(QuantizedModelTest, ClearErrors) {
  ThreadPool pool(1);
  const std::string dir = testing::WriteTempModel(testing::TinySpec());  // hidden 64, ffn 96
  auto bad = Model::Load(dir, pool, {.quantize = {4, 64, false}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("cannot quantize \"model.layers.0.mlp.down_proj.weight\": group size 64 "
                        "does not divide the input dimension 96"));

  EXPECT_EQ(ParseWeightQuantization("none", 0)->bits, 0);
  EXPECT_EQ(*ParseWeightQuantization("int8", 0), (kernels::QuantFormat{8, -1, false}));
  EXPECT_EQ(*ParseWeightQuantization("int4", 0), (kernels::QuantFormat{4, 128, false}));
  EXPECT_EQ(*ParseWeightQuantization("int4", 32), (kernels::QuantFormat{4, 32, false}));
  EXPECT_EQ(*ParseWeightQuantization("int8", -1), (kernels::QuantFormat{8, -1, false}));
  EXPECT_THAT(std::string(ParseWeightQuantization("int3", 0).status().message()),
              HasSubstr("none, int8 or int4, got \"int3\""));
  EXPECT_THAT(std::string(ParseWeightQuantization("int4", 48).status().message()),
              HasSubstr("group_size must be -1 (one group per row), 16, 32, 64, 128 or 256, got "
                        "48"));
  EXPECT_EQ(QuantizationName({4, 128, false}), "int4-g128");
  EXPECT_EQ(QuantizationName({8, -1, false}), "int8");
  EXPECT_EQ(QuantizationName({4, 32, true}), "int4-g32-zp");

  // model.activation_quantization: int8 rounds the inputs of quantized matrices only.
  EXPECT_EQ(*ParseWeightQuantization("int4", 32, "int8"),
            (kernels::QuantFormat{4, 32, false, true, kActivationBlock}));
  EXPECT_EQ(QuantizationName(*ParseWeightQuantization("int4", 32, "int8")), "int4-g32-a8");
  // int8-token: one scale per row (token), as W8A8 checkpoints round.
  EXPECT_EQ(*ParseWeightQuantization("int8", 0, "int8-token"),
            (kernels::QuantFormat{8, -1, false, true, 0}));
  EXPECT_EQ(QuantizationName(*ParseWeightQuantization("int8", 0, "int8-token")), "int8-a8t");
  EXPECT_THAT(
      std::string(ParseWeightQuantization("int4", 32, "fp8").status().message()),
      HasSubstr("model.activation_quantization must be none, int8 or int8-token, got \"fp8\""));
  auto float_a8 = Model::Load(dir, pool, {.quantize = *ParseWeightQuantization("none", 0, "int8")});
  ASSERT_FALSE(float_a8.ok());
  EXPECT_THAT(std::string(float_a8.status().message()),
              HasSubstr("model.activation_quantization: int8 rounds the input of quantized "
                        "matrices"));
  EXPECT_EQ(WeightFormatName(DType::kBF16, {}), "bf16");

  // model.lm_head_quantization: int8 with one scale per row, its input rounded as the layers'.
  EXPECT_EQ(ParseLmHeadQuantization("none", {})->bits, 0);
  EXPECT_EQ(*ParseLmHeadQuantization("int8", {4, 32, false}), (kernels::QuantFormat{8, -1}));
  const kernels::QuantFormat a8 = *ParseWeightQuantization("int4", 32, "int8");
  EXPECT_EQ(*ParseLmHeadQuantization("int8", a8),
            (kernels::QuantFormat{8, -1, false, true, kActivationBlock}));
  EXPECT_THAT(std::string(ParseLmHeadQuantization("int4", {}).status().message()),
              HasSubstr("model.lm_head_quantization must be none or int8, got \"int4\""));
  EXPECT_EQ(LoadedQuantizationName({}, {}, {8, -1}), "lm_head-int8");
  EXPECT_EQ(LoadedQuantizationName({}, a8, *ParseLmHeadQuantization("int8", a8)),
            "int4-g32-a8+lm_head-int8-a8");
  // With lm_head quantized, int8 activations have a quantized matrix to round for.
  auto head_a8 = Model::Load(dir, pool,
                             {.quantize = *ParseWeightQuantization("none", 0, "int8"),
                              .lm_head_quantize = *ParseLmHeadQuantization(
                                  "int8", *ParseWeightQuantization("none", 0, "int8"))});
  ASSERT_TRUE(head_a8.ok()) << head_a8.status();
  EXPECT_EQ((*head_a8)->weights().format(), "lm_head-int8-a8");
  EXPECT_THAT((*head_a8)->weights().cpu_gemm_implementation, HasSubstr("integer"));

  // model.cpu_gemm: onednn multiplies float weights only; auto leaves quantized ones alone.
  auto onednn =
      Model::Load(dir, pool, {.quantize = {4, 32, false}, .cpu_gemm = kernels::CpuGemm::kOnednn});
  ASSERT_FALSE(onednn.ok());
  EXPECT_THAT(std::string(onednn.status().message()),
              HasSubstr("model.cpu_gemm: onednn multiplies float weights on the CPU backend; "
                        "this model's are quantized"));
  auto automatic =
      Model::Load(dir, pool, {.quantize = {4, 32, false}, .cpu_gemm = kernels::CpuGemm::kAuto});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ((*automatic)->weights().cpu_gemm, "tandem (quantized weights)");
  // model-inspect info names the kernels that multiply them (kernels::QuantKernelName).
  EXPECT_THAT((*automatic)->weights().cpu_gemm_implementation,
              HasSubstr("float (codes to f32 in registers"));
  EXPECT_EQ((*automatic)->weights().layers[0].q_proj.layout, kernels::WeightLayout::kQuantPanels);
}

}  // namespace
}  // namespace tandem::model
