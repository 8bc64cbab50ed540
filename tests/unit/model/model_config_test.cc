#include "common/model/model_config.h"

#include <cmath>
#include <numbers>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;

nlohmann::json Llama3Json() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 2048},
          {"intermediate_size", 8192},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"num_hidden_layers", 16},
          {"max_position_embeddings", 131072},
          {"vocab_size", 128256},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 32.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}}},
          {"tie_word_embeddings", true},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", 128000},
          {"eos_token_id", {128001, 128008, 128009}}};
}

absl::StatusOr<ModelConfig> Parse(const nlohmann::json& j) {
  return ModelConfig::FromJson(j.dump(), "dir/config.json");
}

TEST(ModelConfigTest, ParsesLlama32Shape) {
  auto c = Parse(Llama3Json());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_THAT(c->eos_token_ids, ::testing::ElementsAre(128001, 128008, 128009));
  EXPECT_TRUE(c->IsEos(128009));
  EXPECT_FALSE(c->IsEos(5));
  // Llama-3.2-1B has 1,235,814,400 parameters.
  EXPECT_EQ(c->ParameterCount(), 1235814400);
}

TEST(ModelConfigTest, Llama3RopeScalingFollowsItsThreeBands) {
  auto c = Parse(Llama3Json());
  ASSERT_TRUE(c.ok());
  std::vector<float> inv = c->RopeInvFreq();
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    double base = 1.0 / std::pow(500000.0, 2.0 * i / 64);
    double wavelen = 2 * std::numbers::pi / base;
    double expect;
    if (wavelen < 8192.0 / 4) {
      expect = base;  // high frequency: unchanged
    } else if (wavelen > 8192.0) {
      expect = base / 32;  // low frequency: scaled by factor
    } else {
      double smooth = (8192.0 / wavelen - 1) / 3;
      expect = (1 - smooth) * base / 32 + smooth * base;
    }
    EXPECT_NEAR(inv[i], expect, expect * 1e-6) << i;
  }
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
}

TEST(ModelConfigTest, Qwen3ExplicitHeadDimAndQwen2Bias) {
  auto j = Llama3Json();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 128;
  j["rope_scaling"] = nullptr;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  j["architectures"] = {"Qwen2ForCausalLM"};
  j.erase("head_dim");
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
}

TEST(ModelConfigTest, MistralSlidingWindowClampsContext) {
  auto j = Llama3Json();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4096;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ContextLength(), 4096);
}

TEST(ModelConfigTest, KvBytesCorrectTheSeedArticle) {
  // Llama-2-70B: 80 layers, 8 KV heads of 128, fp16: 4 KiB per token per layer, 320 KiB per
  // token, 10 GiB for a 32K sequence (the seed's "4 MB per token per layer" is wrong).
  auto j = Llama3Json();
  j["hidden_size"] = 8192;
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 8;
  j["num_hidden_layers"] = 80;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok());
  kv::KvLayout l = c->KvLayoutFor(DType::kF16, 16);
  EXPECT_EQ(l.BytesPerToken() / 80, 4096u);
  EXPECT_EQ(l.BytesPerToken(), 327680u);
  EXPECT_EQ(l.BytesPerToken() * 32768, 10ull << 30);
}

TEST(ModelConfigTest, ErrorsNameTheFileAndKey) {
  struct Case {
    std::function<void(nlohmann::json&)> mutate;
    std::string expect;
  };
  std::vector<Case> cases = {
      {[](auto& j) { j.erase("hidden_size"); }, "\"hidden_size\" is missing"},
      {[](auto& j) { j["hidden_size"] = "big"; }, "\"hidden_size\" must be an integer"},
      {[](auto& j) { j["num_hidden_layers"] = 1 << 30; }, "\"num_hidden_layers\" is"},
      {[](auto& j) { j["vocab_size"] = -5; }, "\"vocab_size\" is -5"},
      {[](auto& j) { j["num_key_value_heads"] = 5; }, "must divide num_attention_heads"},
      {[](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; }, "unsupported architecture"},
      {[](auto& j) { j["architectures"] = 3; }, "\"architectures\""},
      {[](auto& j) { j["rope_scaling"]["rope_type"] = "yarn"; }, "not supported"},
      {[](auto& j) { j["rope_scaling"].erase("factor"); }, "\"factor\" is missing"},
      {[](auto& j) { j["torch_dtype"] = "int4"; }, "\"torch_dtype\""},
      {[](auto& j) { j["eos_token_id"] = "x"; }, "eos_token_id"},
      {[](auto& j) { j["head_dim"] = 63; }, "must be even"},
      {[](auto& j) { j["tie_word_embeddings"] = "yes"; }, "must be true or false"},
  };
  for (const auto& tc : cases) {
    auto j = Llama3Json();
    tc.mutate(j);
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << tc.expect;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("dir/config.json")) << tc.expect;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(tc.expect));
  }
  EXPECT_THAT(std::string(ModelConfig::FromJson("{\"a\": ", "x.json").status().message()),
              HasSubstr("x.json: not valid JSON"));
  EXPECT_FALSE(ModelConfig::FromJson("[1, 2]", "x.json").ok());
  EXPECT_EQ(ModelConfig::FromDirectory("/nonexistent/dir").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::model
