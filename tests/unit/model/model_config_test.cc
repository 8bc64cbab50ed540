#include "common/model/model_config.h"

#include <cmath>
#include <numbers>

#include "common/model/model_weights.h"
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

// quantization_config as published checkpoints write it (TheBloke's GPTQ and AWQ exports,
// llm-compressor's W8A8 and W4A16): parsed and named.
TEST(QuantizationConfigTest, PublishedFormatsAreRecognized) {
  using Method = QuantizationConfig::Method;
  using Packing = QuantizationConfig::Packing;
  const nlohmann::json gptq = {{"bits", 4},          {"group_size", 128}, {"damp_percent", 0.1},
                               {"desc_act", true},   {"sym", true},       {"true_sequential", true},
                               {"quant_method", "gptq"}};
  const nlohmann::json awq = {{"quant_method", "awq"}, {"zero_point", true}, {"group_size", 64},
                              {"bits", 4},             {"version", "gemm"},
                              {"modules_to_not_convert", nullptr}};
  const nlohmann::json w8a8 = nlohmann::json::parse(R"({
      "config_groups": {"group_0": {
        "input_activations": {"actorder": null, "dynamic": true, "group_size": null,
                              "num_bits": 8, "observer": "memoryless", "strategy": "token",
                              "symmetric": true, "type": "int"},
        "output_activations": null, "targets": ["Linear"],
        "weights": {"actorder": null, "dynamic": false, "group_size": null, "num_bits": 8,
                    "observer": "minmax", "strategy": "channel", "symmetric": true,
                    "type": "int"}}},
      "format": "int-quantized", "ignore": ["lm_head"], "kv_cache_scheme": null,
      "quant_method": "compressed-tensors", "quantization_status": "compressed"})");
  nlohmann::json w4a16 = w8a8;
  w4a16["format"] = "pack-quantized";
  w4a16["sparsity_config"] = nlohmann::json::object();
  w4a16["config_groups"]["group_0"]["input_activations"] = nullptr;
  w4a16["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  w4a16["config_groups"]["group_0"]["weights"]["strategy"] = "group";
  w4a16["config_groups"]["group_0"]["weights"]["group_size"] = 128;
  struct Want {
    nlohmann::json q;
    Method method;
    Packing packing;
    std::string name;
  };
  for (const Want& want : std::vector<Want>{
           {gptq, Method::kGptq, Packing::kGptq, "gptq-w4-g128-sym-act"},
           {awq, Method::kAwq, Packing::kAwqGemm, "awq-w4-g64"},
           {w8a8, Method::kCompressedTensors, Packing::kCtInt, "ct-w8a8-channel"},
           {w4a16, Method::kCompressedTensors, Packing::kCtPacked, "ct-w4-g128"}}) {
    auto j = Llama3Json();
    j["quantization_config"] = want.q;
    auto c = Parse(j);
    ASSERT_TRUE(c.ok()) << want.name << ": " << c.status();
    const QuantizationConfig& q = c->quantization;
    EXPECT_EQ(q.method, want.method) << want.name;
    EXPECT_EQ(q.packing, want.packing) << want.name;
    EXPECT_EQ(q.Name(), want.name);
    // Each loads (quantized_checkpoint_test.cc): the loader goes on to look for the files.
    auto w = ModelWeights::Load("/nonexistent", *c);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << want.name << w.status();
  }
  auto plain = Parse(Llama3Json());
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->quantization.quantized());
  EXPECT_EQ(plain->quantization.Name(), "none");
  // Details the names leave out.
  auto j = Llama3Json();
  j["quantization_config"] = gptq;
  j["quantization_config"]["group_size"] = -1;
  j["quantization_config"]["sym"] = false;
  j["quantization_config"]["checkpoint_format"] = "gptq_v2";
  j["quantization_config"]["lm_head"] = true;
  const QuantizationConfig g = Parse(j)->quantization;
  EXPECT_EQ(g.group_size, 0);
  EXPECT_FALSE(g.symmetric);
  EXPECT_TRUE(g.gptq_v2);
  EXPECT_TRUE(g.lm_head);
  EXPECT_EQ(g.Name(), "gptq-w4-asym-act-v2");

  j["quantization_config"] = w8a8;
  EXPECT_FALSE(Parse(j)->quantization.lm_head);  // "ignore": ["lm_head"]
  EXPECT_TRUE(Parse(j)->quantization.int8_activations);
}

TEST(QuantizationConfigTest, VariantsTandemCannotReadAreRefusedByName) {
  struct Case {
    nlohmann::json q;
    std::string expect;
  };
  const nlohmann::json ct_group = {
      {"targets", {"Linear"}},
      {"weights", {{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}}}};
  auto ct = [&](nlohmann::json group) {
    return nlohmann::json{{"quant_method", "compressed-tensors"},
                          {"format", "int-quantized"},
                          {"config_groups", {{"group_0", group}}}};
  };
  nlohmann::json static_input = ct_group;
  static_input["input_activations"] = {{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"},
                                       {"dynamic", false}};
  nlohmann::json fp8 = ct_group;
  fp8["weights"]["type"] = "float";
  nlohmann::json tensor_scale = ct_group;
  tensor_scale["weights"]["strategy"] = "tensor";
  nlohmann::json two = ct(ct_group);
  two["config_groups"]["group_1"] = ct_group;
  const std::vector<Case> cases = {
      {{{"quant_method", "fp8"}}, "\"quantization_config.quant_method\" is \"fp8\""},
      {{{"quant_method", "bitsandbytes"}}, "gptq, awq and compressed-tensors"},
      {{{"quant_method", "gptq"}, {"bits", 3}}, "\"quantization_config.bits\" is 3"},
      {{{"quant_method", "gptq"}, {"group_size", 0}}, "\"quantization_config.group_size\" is 0"},
      {{{"quant_method", "gptq"}, {"checkpoint_format", "marlin"}}, "\"marlin\""},
      {{{"quant_method", "gptq"}, {"dynamic", {{"-:.*mlp", {}}}}},
       "\"quantization_config.dynamic\""},
      {{{"quant_method", "gptq"}, {"desc_act", "yes"}}, "\"quantization_config.desc_act\""},
      {{{"quant_method", "awq"}, {"version", "gemv_fast"}}, "\"quantization_config.version\""},
      {{{"quant_method", "awq"}, {"w_bit", 8}}, "\"quantization_config.w_bit\" is 8"},
      {{{"quant_method", "awq"}, {"zero_point", false}}, "\"quantization_config.zero_point\""},
      {ct(static_input), "config_groups.group_0.input_activations\" is"},
      {ct(fp8), "config_groups.group_0.weights.type\" is \"float\""},
      {ct(tensor_scale), "weights.strategy\" is \"tensor\""},
      {two, "exactly one scheme"},
      {nlohmann::json{{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}},
       "\"quantization_config.format\" is \"float-quantized\""},
      {nlohmann::json{{"quant_method", "compressed-tensors"},
                      {"format", "int-quantized"},
                      {"sparsity_config", {{"format", "sparse-24"}}},
                      {"config_groups", {{"group_0", ct_group}}}},
       "\"quantization_config.sparsity_config\""},
      {nlohmann::json::array({1}), "\"quantization_config\" must be an object"},
  };
  for (const Case& tc : cases) {
    auto j = Llama3Json();
    j["quantization_config"] = tc.q;
    auto c = Parse(j);
    ASSERT_FALSE(c.ok()) << tc.q.dump();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("dir/config.json")) << tc.q.dump();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(tc.expect)) << tc.q.dump();
  }
}

}  // namespace
}  // namespace tandem::model
