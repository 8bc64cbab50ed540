// The model on the CUDA backend against the same model on the CPU (label cuda; skipped where no
// GPU is present): logits of a prefill and of decode steps within 1e-2 x std(logits), greedy
// tokens equal for 32 steps, and a batch equal to its sequences run alone.

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/backend_factory.h"
#include "common/model/model.h"
#include "common/util/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::model {
namespace {

using make_random_model::Arch;

constexpr int kBlockSize = 16;

// A model and a KV pool in its backend's memory, sequences laid out in consecutive blocks.
struct Runner {
  std::unique_ptr<Model> model;
  kv::KvLayout layout;
  void* pool = nullptr;
  std::vector<std::vector<int32_t>> tables;

  ~Runner() {
    if (pool != nullptr) model->backend().Free(pool);
  }
  void Init(int sequences, int max_tokens) {
    const ModelConfig& c = model->config();
    layout = {.num_layers = c.num_layers,
              .num_kv_heads = c.num_kv_heads,
              .head_dim = c.head_dim,
              .block_size = kBlockSize,
              .dtype = DType::kBF16};
    const int per_seq = (max_tokens + kBlockSize - 1) / kBlockSize;
    pool = model->backend().Allocate(layout.BlockBytes() * per_seq * sequences).value();
    for (int s = 0; s < sequences; ++s) {
      tables.emplace_back();
      for (int b = 0; b < per_seq; ++b) tables.back().push_back(s * per_seq + b);
    }
  }
  // Logits of the last token of each sequence given `tokens[s]` at positions start[s]...
  std::vector<float> Step(const std::vector<std::vector<int32_t>>& tokens,
                          const std::vector<int64_t>& start, const std::vector<int>& which) {
    std::vector<ForwardSequence> batch;
    for (int s : which) {
      batch.push_back({.tokens = tokens[s].data(),
                       .num_tokens = static_cast<int>(tokens[s].size()),
                       .start_pos = start[s],
                       .block_table = tables[s].data()});
    }
    std::vector<float> logits;
    const absl::Status st = model->Forward(
        batch, kv::KvArena{.base = static_cast<uint8_t*>(pool), .layout = layout}, logits);
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  }
};

int32_t Argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

class ModelCudaTest : public ::testing::TestWithParam<std::tuple<Arch, DType>> {
 protected:
  void SetUp() override {
    ThreadPool probe_pool(1);
    auto probe = kernels::CreateBackend({.kind = kernels::DeviceSpec::Kind::kCuda}, probe_pool);
    if (!probe.ok()) GTEST_SKIP() << "no CUDA device: " << probe.status().message();
    auto spec = testing::TinySpec(std::get<0>(GetParam()));
    spec.dtype = std::get<1>(GetParam());
    spec.layers = 3;
    spec.hidden = 128;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.ffn = 320;
    spec.vocab = 512;
    dir_ = testing::WriteTempModel(spec);
    cpu_.model = Model::Load(dir_, pool_).value();
    gpu_.model =
        Model::Load(dir_, pool_, {.device = {.kind = kernels::DeviceSpec::Kind::kCuda}}).value();
  }

  void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu,
                   const std::string& what) {
    ASSERT_EQ(gpu.size(), cpu.size()) << what;
    double mean = 0, var = 0;
    for (float x : cpu) mean += x;
    mean /= cpu.size();
    for (float x : cpu) var += (x - mean) * (x - mean);
    const double tol = 1e-2 * std::sqrt(var / cpu.size());
    double worst = 0;
    for (size_t i = 0; i < cpu.size(); ++i)
      worst = std::max(worst, double{std::fabs(gpu[i] - cpu[i])});
    EXPECT_LE(worst, tol) << what;
  }

  ThreadPool pool_{2};
  std::string dir_;
  Runner cpu_, gpu_;
};

TEST_P(ModelCudaTest, LogitsAndGreedyTokensMatchTheCpu) {
  const int64_t vocab = cpu_.model->config().vocab_size;
  const int kSeqs = 3, kSteps = 32;
  cpu_.Init(kSeqs, 200);
  gpu_.Init(kSeqs, 200);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab) - 1);
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    prompts[s].resize(17 + 40 * s);  // block boundaries crossed differently
    for (int32_t& t : prompts[s]) t = tok(rng);
  }
  std::vector<int64_t> start(kSeqs, 0);
  std::vector<int> all = {0, 1, 2};
  std::vector<float> lc = cpu_.Step(prompts, start, all), lg = gpu_.Step(prompts, start, all);
  ExpectClose(lg, lc, "prefill logits");
  std::vector<std::vector<int32_t>> next(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    start[s] = static_cast<int64_t>(prompts[s].size());
    next[s] = {Argmax(lc.data() + s * vocab, vocab)};
    EXPECT_EQ(Argmax(lg.data() + s * vocab, vocab), next[s][0]) << "first token of " << s;
  }
  for (int step = 0; step < kSteps; ++step) {
    lc = cpu_.Step(next, start, all);
    lg = gpu_.Step(next, start, all);
    ExpectClose(lg, lc, absl::StrCat("decode step ", step));
    for (int s = 0; s < kSeqs; ++s) {
      const int32_t want = Argmax(lc.data() + s * vocab, vocab);
      ASSERT_EQ(Argmax(lg.data() + s * vocab, vocab), want) << "step " << step << " seq " << s;
      next[s] = {want};
      ++start[s];
    }
  }
}

TEST_P(ModelCudaTest, ABatchEqualsItsSequencesAlone) {
  const int64_t vocab = gpu_.model->config().vocab_size;
  gpu_.Init(2, 64);
  std::vector<std::vector<int32_t>> prompts = {
      {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}, {40, 41, 42}};
  std::vector<int64_t> start = {0, 0};
  const std::vector<float> batched = gpu_.Step(prompts, start, {0, 1});
  const std::vector<float> first = gpu_.Step(prompts, start, {0});
  const std::vector<float> second = gpu_.Step(prompts, start, {1});
  std::vector<float> alone = first;
  alone.insert(alone.end(), second.begin(), second.end());
  ASSERT_EQ(batched.size(), alone.size());
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(Argmax(batched.data() + s * vocab, vocab), Argmax(alone.data() + s * vocab, vocab));
  }
  ExpectClose(batched, alone, "batched vs alone");
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, ModelCudaTest,
    ::testing::Values(std::tuple{Arch::kLlama, DType::kF32}, std::tuple{Arch::kLlama, DType::kBF16},
                      std::tuple{Arch::kQwen2, DType::kBF16},
                      std::tuple{Arch::kQwen3, DType::kBF16},
                      std::tuple{Arch::kMistral, DType::kF16}),
    [](const auto& info) {
      return absl::StrCat(std::string(make_random_model::ArchModelType(std::get<0>(info.param))),
                          "_", std::string(DTypeName(std::get<1>(info.param))));
    });

}  // namespace
}  // namespace tandem::model
