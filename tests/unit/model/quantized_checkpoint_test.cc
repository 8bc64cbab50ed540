// Loading quantized checkpoints (GPTQ, AWQ, compressed-tensors) that WriteQuantizedCheckpoint
// (model-inspect quantize) writes from a float model by round-to-nearest: the loaded model must
// compute exactly what quantizing the float model at load computes. The formats' definitions
// are checked independently by the torch reference (tests/reference, parity cases llama_gptq4,
// qwen3_gptq4_act, llama_awq4, *_ct_*), which dequantizes each from its own packing.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/gemm.h"
#include "common/kernels/cpu/int8_tiles.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/model/model.h"
#include "common/model/quantized_writer.h"
#include "common/model/safetensors.h"
#include "common/model/scratch_kv.h"
#include "common/util/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/testing/temp_model.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;
using Format = CheckpointQuantization::Format;
using Tensors = std::vector<SafetensorsTensor>;

// Writes `q`'s checkpoint of the float model in `float_dir` to a new directory; `edit` may
// change its tensors afterwards.
std::string Quantize(const std::string& float_dir, const CheckpointQuantization& q,
                     const std::function<void(Tensors&)>& edit = nullptr) {
  const std::string dir = testing::MakeTempDir("quantized") + "/checkpoint";
  ThreadPool pool(2);
  absl::Status written = WriteQuantizedCheckpoint(float_dir, dir, q, pool);
  EXPECT_TRUE(written.ok()) << written;
  if (!edit) return dir;
  Tensors tensors;
  {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    EXPECT_TRUE(file.ok()) << file.status();
    for (const TensorEntry& e : (*file)->tensors()) {
      tensors.push_back(
          {e.name, e.dtype, e.shape,
           std::string(reinterpret_cast<const char*>((*file)->Data(e)), e.end - e.begin)});
    }
  }
  edit(tensors);
  EXPECT_TRUE(WriteSafetensorsFile(dir + "/model.safetensors", tensors).ok());
  return dir;
}

std::vector<float> Logits(Model& model) {
  std::vector<int32_t> prompt(24);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 128);
  ScratchKv kv(model, DType::kF32, static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(kv.Forward(prompt.data(), 24, 0, LogitsMode::kAll, nullptr).ok());
  return kv.logits();
}

struct FormatCase {
  CheckpointQuantization q;
  std::string name;  // ModelWeights::quantization
};

TEST(QuantizedCheckpointTest, ComputesWhatQuantizingAtLoadComputes) {
  using make_random_model::Arch;
  ThreadPool pool(2);
  const FormatCase cases[] = {
      {{Format::kGptq, 4, 32, true}, "gptq-w4-g32-sym"},
      {{Format::kGptq, 4, 32, false}, "gptq-w4-g32-asym"},
      {{Format::kGptq, 8, -1, true}, "gptq-w8-sym"},
      {{Format::kGptq, 8, 32, false}, "gptq-w8-g32-asym"},
      {{Format::kGptq, 4, -1, false}, "gptq-w4-asym"},
      {{Format::kAwq, 4, 32, false}, "awq-w4-g32"},
      {{Format::kAwq, 4, 16, true}, "awq-w4-g16"},
      {{Format::kCompressedTensors, 8, -1, true}, "ct-w8-channel"},
      {{Format::kCompressedTensors, 8, 32, false}, "ct-w8-g32-asym"},
      {{Format::kCompressedTensors, 4, 16, true}, "ct-w4-g16"},
  };
  for (Arch arch : {Arch::kLlama, Arch::kQwen2}) {
    const std::string float_dir = testing::WriteTempModel(testing::TinySpec(arch));
    for (const FormatCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << "arch " << static_cast<int>(arch) << " " << c.name);
      const std::string dir = Quantize(float_dir, c.q);
      auto loaded = Model::Load(dir, pool, {.memory = WeightMemory::kHugePages});
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      const ModelWeights& w = (*loaded)->weights();
      const kernels::QuantFormat f{c.q.bits, c.q.group_size, !c.q.symmetric};
      EXPECT_EQ(w.layers[1].up_proj.layout, kernels::WeightLayout::kQuantPanels);
      // AWQ always stores zeros; the loader drops them when every one is the middle code.
      EXPECT_EQ(w.layers[1].up_proj.quant, f);
      EXPECT_EQ(w.layers[1].up_proj.input_order, nullptr);
      EXPECT_EQ(w.quantization, c.name);
      auto on_load =
          Model::Load(float_dir, pool, {.memory = WeightMemory::kHugePages, .quantize = f});
      ASSERT_TRUE(on_load.ok()) << on_load.status();
      EXPECT_EQ(Logits(**loaded), Logits(**on_load));
    }
  }
}

TEST(QuantizedCheckpointTest, W8A8RoundsActivations) {
  ThreadPool pool(2);
  const std::string float_dir = testing::WriteTempModel(testing::TinySpec());
  CheckpointQuantization q{Format::kCompressedTensors, 8, -1, true};
  const std::string weight_only = Quantize(float_dir, q);
  q.int8_activations = true;
  const std::string w8a8 = Quantize(float_dir, q);
  auto a = Model::Load(weight_only, pool);
  auto b = Model::Load(w8a8, pool);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ((*b)->weights().quantization, "ct-w8a8-channel");
  EXPECT_TRUE((*b)->weights().layers[0].q_proj.quant.int8_activations);
  const std::vector<float> la = Logits(**a), lb = Logits(**b);
  EXPECT_NE(la, lb);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    diff = std::max<double>(diff, std::fabs(la[i] - lb[i]));
    norm = std::max<double>(norm, std::fabs(la[i]));
  }
  EXPECT_LT(diff, 0.1 * norm);  // rounding to 8 bits moves the logits a little, not a lot

  // model.activation_quantization: int8 rounds a weight-only checkpoint's inputs in blocks; a
  // W8A8 checkpoint keeps its own per-token rounding.
  const kernels::QuantFormat a8{.int8_activations = true, .activation_block = kActivationBlock};
  auto c = Model::Load(weight_only, pool, {.quantize = a8});
  auto d = Model::Load(w8a8, pool, {.quantize = a8});
  ASSERT_TRUE(c.ok() && d.ok()) << c.status() << d.status();
  EXPECT_EQ((*c)->weights().quantization, (*a)->weights().quantization + "-a8");
  EXPECT_EQ((*c)->weights().layers[0].q_proj.quant.activation_block, kActivationBlock);
  EXPECT_NE(Logits(**c), la);
  EXPECT_EQ((*d)->weights().quantization, "ct-w8a8-channel");
  EXPECT_EQ((*d)->weights().layers[0].q_proj.quant.activation_block, 0);
  EXPECT_EQ(Logits(**d), lb);

  // model.cpu_gemm auto: on a CPU with AMX-INT8 the per-token W8A8 matrices go onto the tiles
  // (kernels/cpu/int8_tiles.h), whose exact integer sums stay close to the own kernels'.
  auto e = Model::Load(w8a8, pool, {.cpu_gemm = kernels::CpuGemm::kAuto});
  ASSERT_TRUE(e.ok()) << e.status();
  const kernels::WeightMatrix& q_proj = (*e)->weights().layers[0].q_proj;
  if (!kernels::Int8TilesFit(q_proj.quant, q_proj.cols)) {
    EXPECT_EQ(q_proj.layout, kernels::WeightLayout::kQuantPanels);
    return;
  }
  EXPECT_EQ(q_proj.layout, kernels::WeightLayout::kInt8Tiles);
  EXPECT_THAT((*e)->weights().cpu_gemm, HasSubstr("AMX-INT8 tiles"));
  EXPECT_THAT((*e)->weights().cpu_gemm_implementation, HasSubstr("tdpbsud"));
  const std::vector<float> le = Logits(**e);
  ASSERT_EQ(le.size(), lb.size());
  for (size_t i = 0; i < le.size(); ++i) EXPECT_NEAR(le[i], lb[i], 1e-3 * norm) << i;
}

// A quantized lm_head (GPTQ lm_head: true): loaded as a quantized matrix, each row the float
// model's row quantized by round-to-nearest. (A tied head, written untied: parity case
// llama_gptq4_head.)
TEST(QuantizedCheckpointTest, QuantizedLmHead) {
  ThreadPool pool(2);
  const std::string float_dir = testing::WriteTempModel(testing::TinySpec());
  CheckpointQuantization q{Format::kGptq, 8, 32, false};
  q.lm_head = true;
  auto m = Model::Load(Quantize(float_dir, q), pool);
  ASSERT_TRUE(m.ok()) << m.status();
  auto float_model = Model::Load(float_dir, pool);
  ASSERT_TRUE(float_model.ok()) << float_model.status();
  const ModelWeights& w = (*m)->weights();
  ASSERT_EQ(w.lm_head.layout, kernels::WeightLayout::kQuantPanels);
  EXPECT_EQ(w.embed_tokens.layout, kernels::WeightLayout::kRowMajor);
  const kernels::QuantFormat f{8, 32, true};
  const int64_t h = w.lm_head.cols;
  std::vector<float> stored(h), head(h), scales(h / 32);
  std::vector<uint8_t> codes(h), zeros(h / 32);
  for (int64_t r = 0; r < w.lm_head.rows; r += 37) {
    kernels::ReadRow((*float_model)->weights().lm_head, r, stored.data());
    kernels::QuantizeRow(f, stored.data(), h, codes.data(), scales.data(), zeros.data());
    kernels::ReadRow(w.lm_head, r, head.data());
    for (int64_t k = 0; k < h; ++k) {
      ASSERT_EQ(head[k], static_cast<float>(codes[k] - zeros[k / 32]) * scales[k / 32]) << r;
    }
  }
  // model.lm_head_quantization on top of it: refused, naming the checkpoint's own.
  auto twice = Model::Load(Quantize(float_dir, q), pool, {.lm_head_quantize = {8, -1}});
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("quantizes lm_head already (gptq-w8-g32-asym); leave "
                        "model.lm_head_quantization at none"));
  // A checkpoint that leaves lm_head in float: quantized at load, and named so.
  q.lm_head = false;
  auto on_load = Model::Load(Quantize(float_dir, q), pool, {.lm_head_quantize = {8, -1}});
  ASSERT_TRUE(on_load.ok()) << on_load.status();
  EXPECT_EQ((*on_load)->weights().lm_head.quant, (kernels::QuantFormat{8, -1}));
  EXPECT_EQ((*on_load)->weights().format(), "gptq-w8-g32-asym+lm_head-int8");

  q.lm_head = true;
  q.format = Format::kAwq;
  q.bits = 4;
  ThreadPool serial(1);
  EXPECT_THAT(
      std::string(WriteQuantizedCheckpoint(float_dir, float_dir + ".awq", q, serial).message()),
      HasSubstr("AWQ leaves lm_head unquantized"));
}

// Act-order: g_idx puts input column k of every q/k/v projection in group k % 2, the codes
// left where they are. The loader sorts the columns by group into one order that the three
// share (one packing of x serves them), and each weight reads its code with its own group's
// scale and zero. (The torch reference checks act-order logits: parity case qwen3_gptq4_act.)
TEST(QuantizedCheckpointTest, ActOrderGroupsAreSortedAndShared) {
  ThreadPool pool(2);
  const std::string float_dir = testing::WriteTempModel(testing::TinySpec());
  const CheckpointQuantization gptq{Format::kGptq, 4, 32, false};
  const std::string dir = Quantize(float_dir, gptq, [](Tensors& t) {
    for (SafetensorsTensor& r : t) {
      if (r.name.find("self_attn") == std::string::npos ||
          r.name.find(".g_idx") == std::string::npos ||
          r.name.find("o_proj") != std::string::npos) {
        continue;
      }
      std::vector<int32_t> g(64);
      for (int k = 0; k < 64; ++k) g[k] = k % 2;
      r.bytes.assign(reinterpret_cast<const char*>(g.data()), g.size() * 4);
    }
  });
  auto config = nlohmann::json::parse(*ReadFileToString(dir + "/config.json"));
  config["quantization_config"]["desc_act"] = true;
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", config.dump()).ok());
  auto m = Model::Load(dir, pool);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights().quantization, "gptq-w4-g32-asym-act");
  const LayerWeights& l = (*m)->weights().layers[0];
  ASSERT_NE(l.q_proj.input_order, nullptr);
  EXPECT_EQ(l.q_proj.input_order, l.k_proj.input_order);
  EXPECT_EQ(l.q_proj.input_order, (*m)->weights().layers[1].v_proj.input_order);
  EXPECT_EQ(l.o_proj.input_order, nullptr);
  for (int j = 0; j < 64; ++j) {
    ASSERT_EQ(l.q_proj.input_order[j], j < 32 ? 2 * j : 2 * (j - 32) + 1) << j;
  }
  // The same checkpoint without the edit holds the codes, scales and zeros.
  auto plain = Model::Load(Quantize(float_dir, gptq), pool);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const kernels::WeightMatrix& p = (*plain)->weights().layers[0].q_proj;
  std::vector<uint8_t> codes(64), zeros(2);
  std::vector<float> scales(2), row(64);
  for (int64_t r = 0; r < p.rows; ++r) {
    kernels::ReadQuantRow(p, r, codes.data(), scales.data(), zeros.data());
    kernels::ReadRow(l.q_proj, r, row.data());
    for (int k = 0; k < 64; ++k) {
      ASSERT_EQ(row[k], static_cast<float>(codes[k] - zeros[k % 2]) * scales[k % 2])
          << r << "," << k;
    }
  }
  EXPECT_NE(Logits(**m), Logits(**plain));
}

TEST(QuantizedCheckpointTest, MalformedOrUnsupportedCheckpointsAreClearErrors) {
  ThreadPool pool(1);
  auto find = [](Tensors& t, const std::string& name) -> SafetensorsTensor& {
    for (SafetensorsTensor& r : t) {
      if (r.name == name) return r;
    }
    ADD_FAILURE() << name;
    return t.front();
  };
  const std::string q = "model.layers.0.self_attn.q_proj";
  struct Case {
    CheckpointQuantization format;
    std::function<void(Tensors&)> edit;
    std::string expect;
  };
  const CheckpointQuantization gptq{Format::kGptq, 4, 32, false};
  const CheckpointQuantization awq{Format::kAwq, 4, 32, false};
  const CheckpointQuantization ct{Format::kCompressedTensors, 8, 32, false};
  const CheckpointQuantization ct4{Format::kCompressedTensors, 4, 32, true};
  auto g_idx = [&](std::vector<int32_t> v) {
    return [&find, q, v](Tensors& t) {
      find(t, q + ".g_idx").bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    };
  };
  std::vector<int32_t> out_of_range(64, 0), crowded(64, 0);
  out_of_range[5] = 2;
  for (int k = 0; k < 40; ++k) crowded[k] = 1;
  const Case cases[] = {
      {gptq, [&](auto& t) { std::erase_if(t, [&](auto& r) { return r.name == q + ".scales"; }); },
       "missing tensor \"" + q + ".scales\""},
      {gptq,
       [&](auto& t) {
         find(t, q + ".qweight").shape = {16, 32};
       },
       "\"" + q + ".qweight\" has shape [16, 32], config.json implies [8, 64]"},
      {gptq, [&](auto& t) { find(t, q + ".qweight").dtype = StDType::kF32; },
       "tensor \"" + q + ".qweight\" has dtype F32, the format stores I32"},
      {gptq, g_idx(out_of_range), "g_idx[5] is 2, outside [0, 2)"},
      {gptq, g_idx(crowded), "g_idx puts more than 32 input columns in group 1"},
      {awq,
       [&](auto& t) {
         find(t, q + ".qzeros").shape = {4, 4};
       },
       "\"" + q + ".qzeros\" has shape [4, 4], config.json implies [2, 8]"},
      {awq, [&](auto& t) { std::erase_if(t, [&](auto& r) { return r.name == q + ".qzeros"; }); },
       "missing tensor \"" + q + ".qzeros\""},
      {ct, [&](auto& t) { find(t, q + ".weight").dtype = StDType::kU8; },
       "tensor \"" + q + ".weight\" has dtype U8, the format stores I8"},
      {ct,
       [&](auto& t) {
         std::erase_if(t, [&](auto& r) { return r.name == q + ".weight_zero_point"; });
       },
       "missing tensor \"" + q + ".weight_zero_point\""},
      {ct4,
       [&](auto& t) {
         const std::vector<int64_t> wrong = {64, 60};
         find(t, q + ".weight_shape").bytes.assign(reinterpret_cast<const char*>(wrong.data()), 16);
       },
       "tensor \"" + q + ".weight_shape\" must be an I64 or I32 [64, 64]"},
  };
  const std::string float_dir = testing::WriteTempModel(testing::TinySpec());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    const std::string dir = Quantize(float_dir, c.format, c.edit);
    auto m = Model::Load(dir, pool);
    ASSERT_FALSE(m.ok()) << c.expect;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(c.expect));
  }

  // A group size that does not divide the input dimension, named.
  const std::string gptq_dir = Quantize(float_dir, gptq);
  auto config = nlohmann::json::parse(*ReadFileToString(gptq_dir + "/config.json"));
  config["quantization_config"]["group_size"] = 48;
  ASSERT_TRUE(WriteStringToFile(gptq_dir + "/config.json", config.dump()).ok());
  auto odd = Model::Load(gptq_dir, pool);
  EXPECT_THAT(std::string(odd.status().message()),
              HasSubstr("group size 48 does not divide its input dimension 64"));

  // Quantizing an already quantized checkpoint, in the tool and at load.
  const std::string again = Quantize(float_dir, gptq);
  auto twice = Model::Load(again, pool, {.quantize = {8, -1, false}});
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("is already quantized (gptq-w4-g32-asym)"));
  ThreadPool serial(1);
  const absl::Status requantize = WriteQuantizedCheckpoint(again, again + ".2", gptq, serial);
  EXPECT_THAT(std::string(requantize.message()), HasSubstr("is already quantized"));

  // Settings a format does not define.
  for (const auto& [bad, expect] : std::vector<std::pair<CheckpointQuantization, std::string>>{
           {{Format::kAwq, 8, 32, false}, "AWQ: --bits must be 4"},
           {{Format::kAwq, 4, -1, false}, "AWQ: --group-size must be > 0"},
           {{Format::kGptq, 3, 32, true}, "GPTQ: --bits must be 4 or 8"},
           {{Format::kGptq, 8, -1, true, true}, "GPTQ is weight-only"},
           {{Format::kCompressedTensors, 4, 32, true, true}, "W8A8 needs --bits 8"},
           {{Format::kCompressedTensors, 4, 32, false}, "written symmetric"}}) {
    EXPECT_THAT(
        std::string(WriteQuantizedCheckpoint(float_dir, float_dir + ".bad", bad, serial).message()),
        HasSubstr(expect));
  }
}

}  // namespace
}  // namespace tandem::model
