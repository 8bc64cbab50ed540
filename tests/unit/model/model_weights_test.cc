#include "common/model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "common/model/model.h"
#include "common/util/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/testing/temp_model.h"

namespace tandem::model {
namespace {

using make_random_model::Arch;
using ::testing::HasSubstr;

absl::Status LoadDir(const std::string& dir) {
  auto c = ModelConfig::FromDirectory(dir);
  if (!c.ok()) return c.status();
  return ModelWeights::Load(dir, *c).status();
}

// Rewrites DIR/model.safetensors with `edit` applied to its JSON header.
void EditHeader(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::string path = dir + "/model.safetensors";
  std::string bytes = *ReadFileToString(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h += ' ';
  uint64_t m = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &m, 8);
  ASSERT_TRUE(WriteStringToFile(path, out + h + bytes.substr(8 + n)).ok());
}

TEST(ModelWeightsTest, LoadsEveryArchitectureAndDtype) {
  for (Arch arch : {Arch::kLlama, Arch::kMistral, Arch::kQwen2, Arch::kQwen3}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      auto spec = testing::TinySpec(arch);
      spec.dtype = dt;
      spec.tie_embeddings = arch == Arch::kQwen2;
      std::string dir = testing::WriteTempModel(spec);
      auto c = ModelConfig::FromDirectory(dir);
      ASSERT_TRUE(c.ok()) << c.status();
      auto w = ModelWeights::Load(dir, *c);
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_EQ((*w)->dtype, dt);
      EXPECT_EQ((*w)->layers.size(), 2u);
      EXPECT_EQ((*w)->layers[0].q_bias.empty(), arch != Arch::kQwen2);
      EXPECT_EQ((*w)->layers[0].q_norm.empty(), arch != Arch::kQwen3);
      EXPECT_EQ((*w)->lm_head.data == (*w)->embed_tokens.data, spec.tie_embeddings);
    }
  }
}

TEST(ModelWeightsTest, ShardedModelGivesSameLogitsAsSingleFile) {
  auto spec = testing::TinySpec();
  std::string one = testing::WriteTempModel(spec, 1);
  std::string three = testing::WriteTempModel(spec, 3);
  ASSERT_TRUE(FileExists(three + "/model.safetensors.index.json"));
  ThreadPool pool(1);
  auto a = Model::Load(one, pool);
  auto b = Model::Load(three, pool);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ea = (*a)->weights().layers[1].down_proj, eb = (*b)->weights().layers[1].down_proj;
  ASSERT_EQ(ea.rows * ea.cols, eb.rows * eb.cols);
  EXPECT_EQ(std::memcmp(ea.data, eb.data, ea.rows * ea.cols * DTypeSize(ea.dtype)), 0);
}

// The weights' fingerprint (part of every KV block hash) is the same for the same files however
// they are loaded, and differs for weights replaced under the same directory: other values of
// the same shapes, or one value changed where a sample reads.
TEST(ModelWeightsTest, FingerprintFollowsTheWeightsNotThePath) {
  auto spec = testing::TinySpec();
  std::string dir = testing::WriteTempModel(spec);
  auto c = ModelConfig::FromDirectory(dir);
  ASSERT_TRUE(c.ok());
  auto fingerprint = [&](const std::string& d, WeightLoadOptions o = {}) {
    auto w = ModelWeights::Load(d, *c, o);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? (*w)->fingerprint : 0;
  };
  const uint64_t first = fingerprint(dir);
  EXPECT_NE(first, 0u);
  EXPECT_EQ(fingerprint(dir, {.memory = WeightMemory::kHugePages}), first);
  EXPECT_EQ(fingerprint(testing::WriteTempModel(spec)), first);  // the same weights elsewhere

  auto reseeded = spec;
  reseeded.seed = spec.seed + 1;
  const std::string other = testing::WriteTempModel(reseeded);
  EXPECT_NE(fingerprint(other), first);

  // One byte of the last tensor's data changed, at the file's end (the last sample).
  const std::string path = dir + "/model.safetensors";
  std::string bytes = *ReadFileToString(path);
  bytes.back() = static_cast<char>(bytes.back() ^ 0x40);
  ASSERT_TRUE(WriteStringToFile(path, bytes).ok());
  EXPECT_NE(fingerprint(dir), first);
}

TEST(ModelWeightsTest, HugePageCopyHoldsTheSameValuesInPanels) {
  auto spec = testing::TinySpec(Arch::kQwen2);
  spec.dtype = DType::kBF16;
  std::string dir = testing::WriteTempModel(spec);
  auto c = ModelConfig::FromDirectory(dir);
  ASSERT_TRUE(c.ok());
  auto mapped = ModelWeights::Load(dir, *c);
  auto copied = ModelWeights::Load(dir, *c, {.memory = WeightMemory::kHugePages});
  ASSERT_TRUE(mapped.ok() && copied.ok());
  // The copy is packed into panels: the same values, read row by row.
  auto same = [](const kernels::WeightMatrix& a, const kernels::WeightMatrix& b) {
    if (a.data == b.data || a.dtype != b.dtype || a.rows != b.rows || a.cols != b.cols ||
        a.layout != kernels::WeightLayout::kRowMajor ||
        b.layout != kernels::WeightLayout::kPanels) {
      return false;
    }
    std::vector<float> ra(a.cols), rb(b.cols);
    for (int64_t r = 0; r < a.rows; ++r) {
      kernels::ReadRow(a, r, ra.data());
      kernels::ReadRow(b, r, rb.data());
      if (ra != rb) return false;
    }
    return true;
  };
  EXPECT_TRUE(same((*mapped)->embed_tokens, (*copied)->embed_tokens));
  EXPECT_TRUE(same((*mapped)->layers[1].v_proj, (*copied)->layers[1].v_proj));
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*copied)->layers[0].q_proj.data) % 64, 0u);
  // The copy keeps nothing of the files mapped (only `mapped` does). /proc/self/maps shows
  // canonical paths, and `dir` may hold a doubled slash: match from its last component.
  const std::string file = dir.substr(dir.rfind('/') + 1) + "/model.safetensors";
  auto mappings_of = [&](const std::string& path) {
    std::ifstream maps("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(maps, line);) n += line.find(path) != std::string::npos;
    return n;
  };
  EXPECT_EQ((*mapped)->layers[1].k_bias, (*copied)->layers[1].k_bias);
  EXPECT_TRUE(ParseWeightMemory("hugepages").ok());
  EXPECT_FALSE(ParseWeightMemory("disk").ok());
  EXPECT_GT(mappings_of(file), 0);
  mapped->reset();
  EXPECT_EQ(mappings_of(file), 0);
  // The copy still computes (its matrices and vectors are its own).
  std::vector<float> row((*copied)->embed_tokens.cols);
  kernels::ReadRow((*copied)->embed_tokens, 3, row.data());
  EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); }));
}

TEST(ModelWeightsTest, MalformedDirectoriesGiveClearErrors) {
  auto spec = testing::TinySpec();
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  std::vector<Case> cases = {
      {[](auto& h) { h.erase("model.layers.1.mlp.up_proj.weight"); },
       "missing tensor \"model.layers.1.mlp.up_proj.weight\""},
      {[](auto& h) {
         h["model.layers.0.self_attn.q_proj.weight"]["shape"] = {32, 128};
       },
       "model.layers.0.self_attn.q_proj.weight\" has shape [32, 128]"},
      {[](auto& h) {
         auto e = h["model.norm.weight"];
         e["dtype"] = "I32";
         h["model.norm.weight"] = e;
       },
       "has dtype I32"},
      {[](auto& h) {
         h["extra.weight"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
       },
       "unexpected tensor \"extra.weight\""},
  };
  for (const auto& c : cases) {
    std::string dir = testing::WriteTempModel(spec);
    EditHeader(dir, c.edit);
    absl::Status s = LoadDir(dir);
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expect));
    EXPECT_THAT(std::string(s.message()), HasSubstr(dir));
  }
  std::string dir = testing::WriteTempModel(spec);
  std::string path = dir + "/model.safetensors";
  std::string bytes = *ReadFileToString(path);
  ASSERT_TRUE(WriteStringToFile(path, bytes.substr(0, bytes.size() - 100)).ok());
  EXPECT_THAT(std::string(LoadDir(dir).message()), HasSubstr("model.safetensors"));
  std::remove(path.c_str());
  EXPECT_EQ(LoadDir(dir).code(), absl::StatusCode::kNotFound);
}

TEST(ModelWeightsTest, ConfigAloneIsEnoughForKvSizing) {
  std::string dir = testing::WriteTempModel(testing::TinySpec());
  std::remove((dir + "/model.safetensors").c_str());
  auto c = ModelConfig::FromDirectory(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->KvLayoutFor(DType::kF16, 16).BytesPerToken(), 2u * 2 * 2 * 16 * 2);
}

}  // namespace
}  // namespace tandem::model
