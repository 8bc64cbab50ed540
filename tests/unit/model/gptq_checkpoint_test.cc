// Loading GPTQ checkpoints: tensors written here from the format's definition (AutoGPTQ's
// packing, v1 zeros), from a float model's weights quantized by round-to-nearest. The loaded
// model must compute exactly what quantizing the float model at load computes.

#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/quant_pack.h"
#include "common/model/model.h"
#include "common/model/scratch_kv.h"
#include "common/util/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/testing/temp_model.h"

namespace tandem::model {
namespace {

using ::testing::HasSubstr;

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

void WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  ASSERT_TRUE(WriteStringToFile(path, out + h + data).ok());
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

bool IsLinear(const std::string& name) {
  for (const char* p :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    if (absl::StrContains(name, absl::StrCat(p, ".weight"))) return true;
  }
  return false;
}

// Rewrites the f32 model in `dir` as a GPTQ checkpoint of `format` (group_size -1: one group
// per row; has_zero: sym false). `edit` may change the tensors before they are written.
void MakeGptq(const std::string& dir, const kernels::QuantFormat& format,
              const std::function<void(std::vector<RawTensor>&)>& edit = nullptr) {
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<RawTensor> out;
  const int bits = format.bits, pf = 32 / bits;
  for (const TensorEntry& e : (*file)->tensors()) {
    std::string raw(reinterpret_cast<const char*>((*file)->Data(e)), e.end - e.begin);
    if (!IsLinear(e.name)) {
      out.push_back({e.name, "F32", e.shape, raw});
      continue;
    }
    const int64_t n = e.shape[0], k = e.shape[1];
    const int64_t group = format.group_size > 0 ? format.group_size : k, groups = k / group;
    std::vector<float> w(n * k);
    std::memcpy(w.data(), raw.data(), raw.size());
    std::vector<uint32_t> qweight(k / pf * n, 0), qzeros(groups * n / pf, 0);
    std::vector<uint16_t> scales(groups * n);
    std::vector<int32_t> g_idx(k);
    std::vector<uint8_t> codes(k), zeros(groups);
    std::vector<float> row_scales(groups);
    for (int64_t r = 0; r < n; ++r) {
      kernels::QuantizeRow(format, w.data() + r * k, k, codes.data(), row_scales.data(),
                           zeros.data());
      for (int64_t c = 0; c < k; ++c) {
        qweight[c / pf * n + r] |= uint32_t{codes[c]} << (c % pf * bits);
      }
      for (int64_t g = 0; g < groups; ++g) {
        const uint32_t zero = format.has_zero ? zeros[g] : 1u << (bits - 1);
        // v1: the zero minus one, masked to its bits.
        qzeros[g * (n / pf) + r / pf] |= ((zero - 1) & ((1u << bits) - 1)) << (r % pf * bits);
        scales[g * n + r] = F32ToF16(row_scales[g]);
      }
    }
    for (int64_t c = 0; c < k; ++c) g_idx[c] = static_cast<int32_t>(c / group);
    const std::string prefix = e.name.substr(0, e.name.size() - 7);
    out.push_back({prefix + ".qweight", "I32", {k / pf, n}, Bytes(qweight)});
    out.push_back({prefix + ".qzeros", "I32", {groups, n / pf}, Bytes(qzeros)});
    out.push_back({prefix + ".scales", "F16", {groups, n}, Bytes(scales)});
    out.push_back({prefix + ".g_idx", "I32", {k}, Bytes(g_idx)});
  }
  file->reset();
  if (edit) edit(out);
  WriteSafetensors(dir + "/model.safetensors", out);
  auto config = nlohmann::json::parse(*ReadFileToString(dir + "/config.json"));
  config["quantization_config"] = {
      {"quant_method", "gptq"},          {"bits", bits},
      {"group_size", format.group_size}, {"desc_act", false},
      {"sym", !format.has_zero},         {"checkpoint_format", "gptq"}};
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", config.dump(2)).ok());
}

std::vector<float> Logits(Model& model) {
  std::vector<int32_t> prompt(24);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 128);
  ScratchKv kv(model, DType::kF32, static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(kv.Forward(prompt.data(), 24, 0, LogitsMode::kAll, nullptr).ok());
  return kv.logits();
}

TEST(GptqCheckpointTest, ComputesWhatQuantizingAtLoadComputes) {
  using make_random_model::Arch;
  ThreadPool pool(2);
  const kernels::QuantFormat formats[] = {
      {4, 32, false}, {4, 32, true}, {8, -1, false}, {8, 32, true}, {4, -1, true}};
  for (Arch arch : {Arch::kLlama, Arch::kQwen2}) {
    for (const kernels::QuantFormat& f : formats) {
      SCOPED_TRACE(::testing::Message()
                   << "arch " << static_cast<int>(arch) << " " << QuantizationName(f));
      const std::string float_dir = testing::WriteTempModel(testing::TinySpec(arch));
      const std::string gptq_dir = testing::WriteTempModel(testing::TinySpec(arch));
      MakeGptq(gptq_dir, f);
      auto gptq = Model::Load(gptq_dir, pool, {.memory = WeightMemory::kHugePages});
      ASSERT_TRUE(gptq.ok()) << gptq.status();
      const ModelWeights& w = (*gptq)->weights();
      EXPECT_EQ(w.layers[1].up_proj.layout, kernels::WeightLayout::kQuantPanels);
      EXPECT_EQ(w.layers[1].up_proj.quant, f);
      EXPECT_EQ(
          w.quantization,
          absl::StrCat("gptq-w", f.bits, f.group_size > 0 ? absl::StrCat("-g", f.group_size) : "",
                       f.has_zero ? "-asym" : "-sym"));
      auto on_load =
          Model::Load(float_dir, pool, {.memory = WeightMemory::kHugePages, .quantize = f});
      ASSERT_TRUE(on_load.ok()) << on_load.status();
      EXPECT_EQ(Logits(**gptq), Logits(**on_load));
    }
  }
}

TEST(GptqCheckpointTest, MalformedOrUnsupportedCheckpointsAreClearErrors) {
  ThreadPool pool(1);
  struct Case {
    std::function<void(std::vector<RawTensor>&)> edit;
    std::string expect;
  };
  auto find = [](std::vector<RawTensor>& t, const std::string& name) -> RawTensor& {
    for (RawTensor& r : t) {
      if (r.name == name) return r;
    }
    ADD_FAILURE() << name;
    return t.front();
  };
  const std::string q = "model.layers.0.self_attn.q_proj";
  const Case cases[] = {
      {[&](auto& t) { std::erase_if(t, [&](auto& r) { return r.name == q + ".scales"; }); },
       "missing tensor \"" + q + ".scales\""},
      {[&](auto& t) {
         find(t, q + ".qweight").shape = {16, 32};
       },
       "\"" + q + ".qweight\" has shape [16, 32], config.json implies [8, 64]"},
      {[&](auto& t) { find(t, q + ".qweight").dtype = "F32"; },
       "tensor \"" + q + ".qweight\" has dtype F32, GPTQ packs I32"},
      {[&](auto& t) {
         RawTensor& g = find(t, q + ".g_idx");
         std::vector<int32_t> idx(64);
         for (int k = 0; k < 64; ++k) idx[k] = (63 - k) / 32;
         g.bytes = Bytes(idx);
       },
       "g_idx[0] is 1, not 0: act-order (desc_act) checkpoints"},
  };
  for (const Case& c : cases) {
    const std::string dir = testing::WriteTempModel(testing::TinySpec());
    MakeGptq(dir, {4, 32, false}, c.edit);
    auto m = Model::Load(dir, pool);
    ASSERT_FALSE(m.ok()) << c.expect;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(c.expect));
  }

  // Quantizing an already quantized checkpoint, and the formats still planned.
  const std::string dir = testing::WriteTempModel(testing::TinySpec());
  MakeGptq(dir, {4, 32, false});
  auto twice = Model::Load(dir, pool, {.quantize = {8, -1, false}});
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("is already quantized (gptq-w4-g32-sym)"));
  auto config = nlohmann::json::parse(*ReadFileToString(dir + "/config.json"));
  config["quantization_config"] = {{"quant_method", "awq"},
                                   {"bits", 4},
                                   {"group_size", 32},
                                   {"zero_point", true},
                                   {"version", "gemm"}};
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", config.dump()).ok());
  auto awq = Model::Load(dir, pool);
  EXPECT_EQ(awq.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(awq.status().message()),
              HasSubstr("AWQ and compressed-tensors are planned"));
}

}  // namespace
}  // namespace tandem::model
