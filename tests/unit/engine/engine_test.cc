#include "common/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <random>

#include "absl/strings/match.h"
#include "common/kernels/cpu/attention.h"
#include "common/kernels/cpu/onednn_gemm.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/engine_run.h"
#include "tests/unit/testing/kv_helpers.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::engine {
namespace {

using Result = testing::EngineResult;
using testing::Greedy;
using testing::RunAll;

std::vector<int32_t> RandomPrompt(int len, uint32_t seed, int vocab) {
  return testing::RandomTokens(len, seed, vocab);
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double mean = 0, var = 0, diff = 0;
  for (float x : a) mean += x;
  mean /= a.size();
  for (float x : a) var += (x - mean) * (x - mean);
  double sd = std::sqrt(var / a.size());
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
  return diff / sd;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::WriteTempModel(testing::TinySpec());
    ASSERT_FALSE(dir_.empty());
    auto m = model::Model::Load(dir_, pool_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  EngineOptions Options() const {
    EngineOptions o;
    o.kv_dtype = DType::kF32;
    o.num_blocks = 256;
    return o;
  }

  std::unique_ptr<Engine> MakeEngine(const EngineOptions& o, model::Model* m = nullptr) {
    auto e = Engine::Create(m ? *m : *model_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  Result Solo(const Request& r) {
    auto e = MakeEngine(Options());
    return RunAll(*e, {r})[r.id];
  }

 public:
  Result SoloResult(const Request& r) { return Solo(r); }

 protected:

  void ExpectSameAsSolo(const std::map<std::string, Result>& got,
                        const std::vector<Request>& requests) {
    for (const auto& r : requests) {
      Result solo = Solo(r);
      const Result& g = got.at(r.id);
      EXPECT_EQ(g.tokens, solo.tokens) << r.id;
      ASSERT_EQ(g.logits.size(), solo.logits.size()) << r.id;
      for (size_t i = 0; i < g.logits.size(); ++i) {
        EXPECT_LE(MaxRelDiff(solo.logits[i], g.logits[i]), 1e-4) << r.id << " step " << i;
      }
    }
  }

  std::vector<Request> MixedRequests(int n, int max_tokens) {
    std::vector<Request> rs;
    for (int i = 0; i < n; ++i) {
      rs.push_back(
          Greedy("r" + std::to_string(i), RandomPrompt(1 + 9 * i, 100 + i, 128), max_tokens));
    }
    return rs;
  }

  ThreadPool pool_{2};
  std::string dir_;
  std::unique_ptr<model::Model> model_;
};

TEST_F(EngineTest, BatchedExecutionMatchesEachSequenceAlone) {
  auto requests = MixedRequests(6, 8);
  auto e = MakeEngine(Options());
  auto got = RunAll(*e, requests);
  ExpectSameAsSolo(got, requests);
  for (const auto& [id, r] : got) EXPECT_EQ(r.finish, FinishReason::kLength) << id;
  EXPECT_EQ(e->KvStats().used_blocks, 0);
}

// `model.weight_memory: hugepages` packs the matrices into panels: the same model, read by
// another kernel family.
TEST_F(EngineTest, PanelWeightsGiveTheSameResults) {
  auto packed = model::Model::Load(dir_, pool_, {.memory = model::WeightMemory::kHugePages});
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ((*packed)->weights().layers[0].q_proj.layout, kernels::WeightLayout::kPanels);
  auto requests = MixedRequests(6, 8);
  auto e = MakeEngine(Options(), packed->get());
  auto got = RunAll(*e, requests);
  ExpectSameAsSolo(got, requests);
}

// KV block hashes cover the weights, not only the model id: a model replaced under the same id
// (or the same directory) keys its blocks apart, so no store or cache serves the old KV; the
// same weights loaded another way key them alike.
TEST_F(EngineTest, BlockHashesFollowTheWeights) {
  EngineOptions o = Options();
  o.model_id = "served-name";
  auto spec = testing::TinySpec();
  spec.seed += 1;
  auto retrained = model::Model::Load(testing::WriteTempModel(spec), pool_);
  auto packed = model::Model::Load(dir_, pool_, {.memory = model::WeightMemory::kHugePages});
  ASSERT_TRUE(retrained.ok() && packed.ok());
  const uint64_t hash = MakeEngine(o)->kv_cache().model_hash();
  EXPECT_NE(MakeEngine(o, retrained->get())->kv_cache().model_hash(), hash);
  EXPECT_EQ(MakeEngine(o, packed->get())->kv_cache().model_hash(), hash);
}

// With panel weights every matrix product sums each output in one fixed order, so a sequence's
// logits do not depend on which others share its batch: bit for bit.
TEST_F(EngineTest, PanelWeightsMakeBatchingBitExact) {
  auto packed = model::Model::Load(dir_, pool_, {.memory = model::WeightMemory::kHugePages});
  ASSERT_TRUE(packed.ok()) << packed.status();
  auto requests = MixedRequests(6, 8);
  auto batched = RunAll(*MakeEngine(Options(), packed->get()), requests);
  for (const auto& r : requests) {
    auto solo = RunAll(*MakeEngine(Options(), packed->get()), {r})[r.id];
    EXPECT_EQ(batched[r.id].tokens, solo.tokens) << r.id;
    EXPECT_EQ(batched[r.id].logits, solo.logits) << r.id;
  }
}

// model.cpu_gemm: onednn keeps batching and chunking bit-exact: each product runs one
// single-threaded oneDNN call per 64 output rows and at most 16 rows of x, whose row results the
// plan checked do not depend on the call's other rows (kernels/cpu/onednn_gemm.h). f32 and bf16
// weights (bf16 skips where oneDNN has no bf16 matmul).
TEST_F(EngineTest, OnednnGemmsMakeBatchingAndChunkingBitExact) {
  // head_dim 64 in bf16: attention on AMX bf16 tiles where the CPU has them, over prompts of up
  // to three key chunks.
  for (auto [dtype, head_dim] :
       {std::pair{DType::kF32, 0}, {DType::kBF16, 0}, {DType::kBF16, 64}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " head_dim " << head_dim);
    make_random_model::ModelSpec spec = testing::TinySpec();
    spec.dtype = dtype;
    spec.head_dim = head_dim;
    const std::string dir = testing::WriteTempModel(spec);
    auto m = model::Model::Load(dir, pool_, {.cpu_gemm = kernels::CpuGemm::kOnednn});
    if (!m.ok() && absl::StrContains(m.status().message(), "onednn has no")) continue;
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ((*m)->weights().layers[0].q_proj.layout, kernels::WeightLayout::kOnednn);
    EXPECT_EQ((*m)->weights().bf16_attention,
              head_dim == 64 && kernels::OnednnCpuInfo().bf16 && kernels::Bf16AttentionTiles(64));
    auto requests = MixedRequests(6, 8);
    EngineOptions options = Options();
    if (head_dim == 64) {  // the tiles read bf16 caches
      options.kv_dtype = DType::kBF16;
      requests.push_back(Greedy("long", RandomPrompt(150, 7, 128), 8));
      requests.push_back(Greedy("longer", RandomPrompt(180, 8, 128), 8));
    }
    auto batched = RunAll(*MakeEngine(options, m->get()), requests);
    EngineOptions chunked = options;
    chunked.chunk_size = 7;
    auto in_chunks = RunAll(*MakeEngine(chunked, m->get()), requests);
    for (const auto& r : requests) {
      auto solo = RunAll(*MakeEngine(options, m->get()), {r})[r.id];
      EXPECT_EQ(batched[r.id].tokens, solo.tokens) << r.id;
      EXPECT_EQ(batched[r.id].logits, solo.logits) << r.id;
      EXPECT_EQ(in_chunks[r.id].logits, solo.logits) << r.id;
    }
    // The same model on the own kernels: close, not equal (bf16 rounds the inputs).
    auto own = RunAll(*MakeEngine(Options()), requests);
    if (dtype == DType::kF32) {
      for (const auto& r : requests) {
        for (size_t i = 0; i < own[r.id].logits.size(); ++i) {
          EXPECT_LE(MaxRelDiff(own[r.id].logits[i], batched[r.id].logits[i]), 1e-4) << r.id;
        }
      }
    }
  }
}

// int8 weights with per-token int8 activations on AMX-INT8 tiles (model.cpu_gemm auto on an AMX
// CPU; skipped elsewhere): each product is one exact integer per output, so batching and
// chunking stay bit-exact, decode steps of a few rows (vpdpbusd) and prefill (tiles) alike; and
// the logits stay close to the own integer kernels', which convert each 32 columns' sum. A bf16
// model with head_dim 64 runs attention on AMX bf16 tiles too, over prompts of up to three key
// chunks.
TEST_F(EngineTest, Int8TilesMakeBatchingAndChunkingBitExact) {
  const kernels::QuantFormat w8a8{.bits = 8, .group_size = -1, .int8_activations = true};
  for (auto [dtype, head_dim] : {std::pair{DType::kF32, 0}, {DType::kBF16, 64}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " head_dim " << head_dim);
    make_random_model::ModelSpec spec = testing::TinySpec();
    spec.dtype = dtype;
    spec.head_dim = head_dim;
    const std::string dir = testing::WriteTempModel(spec);
    auto m =
        model::Model::Load(dir, pool_, {.quantize = w8a8, .cpu_gemm = kernels::CpuGemm::kAuto});
    ASSERT_TRUE(m.ok()) << m.status();
    if ((*m)->weights().layers[0].q_proj.layout != kernels::WeightLayout::kInt8Tiles) {
      GTEST_SKIP() << "no AMX-INT8 tiles on this CPU: " << (*m)->weights().cpu_gemm;
    }
    EXPECT_EQ((*m)->weights().bf16_attention, head_dim == 64);
    EXPECT_EQ((*m)->weights().kernels,
              head_dim == 64 ? "tandem+amx-int8+bf16-attention" : "tandem+amx-int8");
    EXPECT_EQ((*m)->weights().layers[1].down_proj.layout, kernels::WeightLayout::kInt8Tiles);
    auto requests = MixedRequests(6, 8);
    EngineOptions options = Options();
    requests.push_back(Greedy("long", RandomPrompt(90, 7, 128), 8));
    if (head_dim == 64) {  // the tiles read bf16 caches
      options.kv_dtype = DType::kBF16;
      requests.push_back(Greedy("longer", RandomPrompt(180, 8, 128), 8));
    }
    auto batched = RunAll(*MakeEngine(options, m->get()), requests);
    EngineOptions chunked = options;
    chunked.chunk_size = 7;
    auto in_chunks = RunAll(*MakeEngine(chunked, m->get()), requests);
    auto own = model::Model::Load(dir, pool_, {.quantize = w8a8});
    ASSERT_TRUE(own.ok()) << own.status();
    ASSERT_EQ((*own)->weights().layers[0].q_proj.layout, kernels::WeightLayout::kQuantPanels);
    auto on_own = RunAll(*MakeEngine(options, own->get()), requests);
    for (const auto& r : requests) {
      auto solo = RunAll(*MakeEngine(options, m->get()), {r})[r.id];
      EXPECT_EQ(batched[r.id].tokens, solo.tokens) << r.id;
      EXPECT_EQ(batched[r.id].logits, solo.logits) << r.id;
      EXPECT_EQ(in_chunks[r.id].logits, solo.logits) << r.id;
      ASSERT_EQ(on_own[r.id].logits.size(), solo.logits.size());
      // bf16 attention rounds q and the probabilities to 8 bits too: on random tiny weights
      // that moves the logits by up to ~0.16 of their spread (0.15 in 64-key chunks, 0.16 in
      // 128; an fp16 cache's 11 bits: 0.005; the kernel against a double reference:
      // PagedAttentionTilesTest).
      // Compared while the greedy tokens agree (a flipped token changes what follows).
      for (size_t i = 0; i < solo.logits.size(); ++i) {
        if (i > 0 && on_own[r.id].tokens[i - 1] != solo.tokens[i - 1]) break;
        EXPECT_LE(MaxRelDiff(on_own[r.id].logits[i], solo.logits[i]), head_dim == 64 ? 0.2 : 1e-3)
            << r.id;
      }
    }
  }
}

// An int8 cache (per token and head scales) against the f32 one, on the same requests: the
// logits move by a fraction of their spread, and batching stays exact with panel weights. (Exact
// parity of the int8 cache with a reference that rounds K/V the same way: reference_*_int8kv.)
TEST_F(EngineTest, Int8KvCacheStaysCloseToFloat) {
  auto requests = MixedRequests(6, 8);
  EngineOptions int8 = Options();
  int8.kv_dtype = DType::kI8;
  auto got = RunAll(*MakeEngine(int8), requests);
  double worst = 0;
  for (const auto& r : requests) {
    const Result solo = Solo(r);
    ASSERT_EQ(got[r.id].logits.size(), solo.logits.size());
    for (size_t i = 0; i < solo.logits.size(); ++i) {
      worst = std::max(worst, MaxRelDiff(solo.logits[i], got[r.id].logits[i]));
    }
  }
  EXPECT_LE(worst, 0.5);  // random tiny weights are sensitive: fp16 gives 0.005, int8 0.24
  EXPECT_GT(worst, 0.0);  // it is a different cache
  std::printf("int8 KV: max |logit diff| / std = %.4f\n", worst);

  auto packed = model::Model::Load(dir_, pool_, {.memory = model::WeightMemory::kHugePages});
  ASSERT_TRUE(packed.ok()) << packed.status();
  auto batched = RunAll(*MakeEngine(int8, packed->get()), requests);
  for (const auto& r : requests) {
    auto solo = RunAll(*MakeEngine(int8, packed->get()), {r})[r.id];
    EXPECT_EQ(batched[r.id].logits, solo.logits) << r.id;
  }
}

// kv_cache.dtype mixed: blocks behind the window are requantized to int8. With a window longer
// than any sequence it is exactly the fp16 cache; with a short one it drifts, within int8's
// bounds, and the requantized blocks are counted.
TEST_F(EngineTest, MixedKvCacheIsFp16InTheWindowAndInt8Behind) {
  auto requests = MixedRequests(6, 8);  // contexts up to 54 tokens
  EngineOptions fp16 = Options();
  fp16.kv_dtype = DType::kF16;
  auto want = RunAll(*MakeEngine(fp16), requests);

  EngineOptions wide_window = fp16;
  wide_window.mixed_kv = {.enabled = true, .sink_tokens = 4, .window_tokens = 64};
  auto e = MakeEngine(wide_window);
  auto same = RunAll(*e, requests);
  for (const auto& r : requests) EXPECT_EQ(same[r.id].logits, want[r.id].logits) << r.id;
  EXPECT_EQ(e->KvStats().narrowed, 0);
  EXPECT_GT(e->KvStats().narrow_blocks, 0);

  EngineOptions mixed = fp16;
  mixed.mixed_kv = {.enabled = true, .sink_tokens = 4, .window_tokens = 16};
  auto m = MakeEngine(mixed);
  auto got = RunAll(*m, requests);
  EXPECT_GT(m->KvStats().narrowed, 0);
  double worst = 0;
  for (const auto& r : requests) {
    ASSERT_EQ(got[r.id].logits.size(), want[r.id].logits.size());
    for (size_t i = 0; i < want[r.id].logits.size(); ++i) {
      worst = std::max(worst, MaxRelDiff(want[r.id].logits[i], got[r.id].logits[i]));
    }
  }
  EXPECT_GT(worst, 0.0);  // some blocks really are int8
  EXPECT_LE(worst, 0.5);  // int8 everywhere gives 0.24 on these random weights
  std::printf("mixed KV (window 16): max |logit diff| / std against fp16 = %.4f\n", worst);

  // The budget is split: fp16 blocks for the windows, int8 blocks for the rest.
  EngineOptions budget = fp16;
  budget.num_blocks = 0;
  budget.kv_cache_bytes = 64 << 20;
  budget.mixed_kv = {.enabled = true, .sink_tokens = 4, .window_tokens = 16, .wide_blocks = 10};
  const kv::KvLayout layout = model_->config().KvLayoutFor(DType::kF16, 16);
  kv::KvLayout narrow = layout;
  narrow.dtype = DType::kI8;
  const auto s = MakeEngine(budget)->KvStats();
  EXPECT_EQ(s.total_blocks - s.narrow_blocks, 10);
  EXPECT_EQ(s.narrow_blocks, ((64 << 20) - 10 * layout.BlockBytes()) / narrow.BlockBytes());
  // By default: room for max_num_seqs windows (1 sink block + 1 window block + 1) and one step.
  budget.mixed_kv.wide_blocks = 0;
  const auto d = MakeEngine(budget)->KvStats();
  EXPECT_EQ(d.total_blocks - d.narrow_blocks,
            budget.max_num_seqs * 3 + budget.max_num_batched_tokens / 16);
}

// kv_cache.eviction: a long sequence keeps its sink block and its last ~budget tokens; the rest
// is evicted after each step, so its cache stops growing while generation goes on.
TEST_F(EngineTest, EvictionKeepsSinksAndTheLastBudgetTokens) {
  const Request r = Greedy("long", RandomPrompt(40, 9, 128), 200);
  EngineOptions base = Options();
  auto want = RunAll(*MakeEngine(base), {r});

  EngineOptions roomy = base;
  roomy.kv_eviction = {.budget_tokens = 512, .sink_tokens = 4};  // never reached
  EXPECT_EQ(RunAll(*MakeEngine(roomy), {r})["long"].logits, want["long"].logits);

  for (bool semantic : {false, true}) {
    SCOPED_TRACE(semantic ? "semantic" : "sliding");
    EngineOptions tight = base;
    // 1 sink block + 3 recent; semantic: cut at a topic shift where one stands out
    tight.kv_eviction = {
        .budget_tokens = 64, .sink_tokens = 4, .semantic = semantic, .chunk_tokens = 16};
    auto e = MakeEngine(tight);
    ASSERT_TRUE(e->AddRequest(r).ok());
    std::vector<std::vector<float>> logits;
    int64_t most_used = 0;
    while (e->HasUnfinished()) {
      auto outs = e->Step();
      ASSERT_TRUE(outs.ok()) << outs.status();
      for (auto& o : *outs) {
        if (!o.logits.empty()) logits.push_back(o.logits);
        EXPECT_TRUE(o.error.ok()) << o.error;
      }
      most_used = std::max(most_used, e->KvStats().used_blocks);
    }
    // 240 tokens would take 15 blocks; the window holds the sink block, 3 recent ones and the
    // one being filled.
    EXPECT_LE(most_used, 5);
    EXPECT_GE(e->KvStats().window_evicted, 10);
    ASSERT_EQ(logits.size(), want["long"].logits.size());
    // Until the cache first exceeds the budget the outputs are the full cache's; after, they
    // differ.
    EXPECT_EQ(logits[0], want["long"].logits[0]);
    EXPECT_GT(MaxRelDiff(want["long"].logits.back(), logits.back()), 1e-3);
  }

  // A cache too small for the whole sequence admits it when eviction bounds what it holds.
  EngineOptions small = base;
  small.num_blocks = 10;
  small.chunk_size = small.max_num_batched_tokens = 16;
  EXPECT_EQ(MakeEngine(small)->AddRequest(r).code(), absl::StatusCode::kResourceExhausted);
  small.kv_eviction = {.budget_tokens = 64, .sink_tokens = 4};
  auto bounded = MakeEngine(small);
  auto got = RunAll(*bounded, {r});
  EXPECT_EQ(got["long"].tokens.size(), 200u);
  EXPECT_EQ(got["long"].finish, FinishReason::kLength);

  EngineOptions bad = base;
  bad.kv_eviction.budget_tokens = -1;
  EXPECT_EQ(Engine::Create(*model_, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, ChunkedPrefillMatchesUnchunked) {
  auto requests = MixedRequests(5, 6);
  EngineOptions o = Options();
  o.chunk_size = 5;
  o.max_num_batched_tokens = 7;
  auto e = MakeEngine(o);
  ExpectSameAsSolo(RunAll(*e, requests), requests);
}

TEST_F(EngineTest, PrefixCacheHitMatchesFullComputation) {
  std::vector<int32_t> shared = RandomPrompt(40, 5, 128);
  std::vector<int32_t> longer = shared;
  for (int t : RandomPrompt(9, 6, 128)) longer.push_back(t);
  auto e = MakeEngine(Options());
  RunAll(*e, {Greedy("a", shared, 8)});
  Request b = Greedy("b", longer, 8);
  auto got = RunAll(*e, {b});
  // Blocks 0 and 1 (tokens 0..31) are shared with "a"; block 2 holds different tokens.
  EXPECT_EQ(got["b"].cached_prompt_tokens, 32);
  EXPECT_GT(e->KvStats().hits, 0);
  ExpectSameAsSolo(got, {b});
}

// The log-softmax of `logits` (in double), for checking the engine's.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(l - max - std::log(sum));
  return out;
}

// Checks `got` (one entry per prompt token after the first, `top` alternatives each) against
// the logits of each prefix of `prompt` run alone: position p's logits are those a request for
// prompt[0..p] samples its first token from.
void ExpectPromptLogprobs(EngineTest& t, const std::vector<int32_t>& prompt,
                          const std::vector<model::TokenLogprobs>& got, int top,
                          const std::string& what);

TEST_F(EngineTest, PromptLogprobsAreEachPrefixsNextTokenLogprobs) {
  const std::vector<int32_t> prompt = RandomPrompt(37, 21, 128);
  Request r = Greedy("p", prompt, 3);
  r.prompt_logprobs = 4;
  ExpectPromptLogprobs(*this, prompt, Solo(r).prompt_logprobs, 4, "solo");
  // Chunked and batched with others, after the same prompt has been cached: the prompt is
  // computed in full (no cached tokens) and gives the same values.
  EngineOptions o = Options();
  o.chunk_size = 5;
  o.max_num_batched_tokens = 7;
  auto e = MakeEngine(o);
  RunAll(*e, {Greedy("warm", prompt, 1)});
  r.prompt_logprobs = 0;
  std::vector<Request> batch = MixedRequests(3, 4);
  batch.push_back(r);
  auto got = RunAll(*e, batch);
  EXPECT_EQ(got["p"].cached_prompt_tokens, 0);
  ExpectPromptLogprobs(*this, prompt, got["p"].prompt_logprobs, 0, "chunked");
  ExpectSameAsSolo(got, batch);
  // The others asked for none.
  EXPECT_TRUE(got["r0"].prompt_logprobs.empty());
}

TEST_F(EngineTest, PromptLogprobsSurvivePreemption) {
  auto requests = MixedRequests(6, 24);
  for (Request& r : requests) r.prompt_logprobs = 2;
  EngineOptions o = Options();
  o.num_blocks = 8;
  auto e = MakeEngine(o);
  auto got = RunAll(*e, requests);
  for (const Request& r : requests) {
    ExpectPromptLogprobs(*this, r.prompt, got[r.id].prompt_logprobs, 2, r.id);
  }
  EXPECT_EQ(e->KvStats().used_blocks, 0);
}

TEST_F(EngineTest, PreemptionUnderMemoryPressureKeepsOutputs) {
  auto requests = MixedRequests(6, 24);
  EngineOptions o = Options();
  o.num_blocks = 8;  // 128 token slots for 6 requests of up to 69 tokens each
  auto e = MakeEngine(o);
  auto got = RunAll(*e, requests);
  ExpectSameAsSolo(got, requests);
  EXPECT_EQ(e->KvStats().used_blocks, 0);
}

TEST_F(EngineTest, StopTokenEosAndMaxTokensFinishSequences) {
  Request base = Greedy("s", RandomPrompt(12, 9, 128), 10);
  Result solo = Solo(base);
  ASSERT_EQ(solo.tokens.size(), 10u);

  Request stop = base;
  stop.stop_token_ids = {solo.tokens[3]};
  auto e = MakeEngine(Options());
  Result r = RunAll(*e, {stop})["s"];
  int first = static_cast<int>(std::find(solo.tokens.begin(), solo.tokens.end(), solo.tokens[3]) -
                               solo.tokens.begin());
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.tokens.size(), static_cast<size_t>(first + 1));

  // Same model with EOS = the 3rd generated token: stops there unless ignore_eos.
  auto config = model::ModelConfig::FromDirectory(dir_);
  ASSERT_TRUE(config.ok());
  config->eos_token_ids = {solo.tokens[2]};
  auto weights = model::ModelWeights::Load(dir_, *config);
  ASSERT_TRUE(weights.ok());
  model::Model eos_model(*config, std::move(*weights), pool_);
  auto e2 = MakeEngine(Options(), &eos_model);
  Request honour = base;
  honour.ignore_eos = false;
  Result h = RunAll(*e2, {honour})["s"];
  EXPECT_EQ(h.finish, FinishReason::kStop);
  EXPECT_LE(h.tokens.size(), 3u);
  EXPECT_EQ(h.tokens.back(), solo.tokens[2]);
  Result ignored = RunAll(*e2, {base})["s"];
  EXPECT_EQ(ignored.tokens, solo.tokens);
  EXPECT_EQ(ignored.finish, FinishReason::kLength);
}

TEST_F(EngineTest, AbortReleasesEveryBlock) {
  auto e = MakeEngine(Options());
  auto requests = MixedRequests(3, 50);
  for (const auto& r : requests) ASSERT_TRUE(e->AddRequest(r).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e->Step().ok());
  EXPECT_GT(e->KvStats().used_blocks, 0);
  e->Abort("r1");
  e->Abort("r2");
  e->Abort("unknown-id");
  auto outs = e->Step();
  ASSERT_TRUE(outs.ok());
  int aborted = 0;
  for (const auto& o : *outs) aborted += o.finish == FinishReason::kAbort;
  EXPECT_EQ(aborted, 2);
  e->Abort("r0");
  ASSERT_TRUE(e->Step().ok());
  EXPECT_FALSE(e->HasUnfinished());
  kv::KvCacheStats s = e->KvStats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.free_blocks + s.cached_blocks, s.total_blocks);
}

TEST_F(EngineTest, HighPriorityRequestsAreAdmittedFirst) {
  EngineOptions o = Options();
  o.max_num_seqs = 1;
  auto e = MakeEngine(o);
  for (const char* id : {"a", "b", "c", "d"}) {
    Request r = Greedy(id, RandomPrompt(12, id[0], 128), 2);
    r.high_priority = std::string(id) == "c" || std::string(id) == "d";
    ASSERT_TRUE(e->AddRequest(std::move(r)).ok());
  }
  std::vector<std::string> finished;
  while (e->HasUnfinished()) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok());
    for (const auto& out : *outs) {
      if (out.finish != FinishReason::kNone) finished.push_back(out.id);
    }
  }
  EXPECT_EQ(finished, (std::vector<std::string>{"c", "d", "a", "b"}));
}

// Queue time is what a request spent waiting for its first step: a request admitted at once
// reports less than one held back while another ran to completion.
// The second request waits for the first (one sequence at a time): its queue time covers at
// least the span from its AddRequest to the step after the first finished. (Comparing it with
// the first's queue time flaked under load: a thread descheduled between the two AddRequests
// gave the first the longer wait.)
TEST_F(EngineTest, OutputsReportTheirQueueTime) {
  EngineOptions o = Options();
  o.max_num_seqs = 1;
  auto e = MakeEngine(o);
  ASSERT_TRUE(e->AddRequest(Greedy("first", RandomPrompt(12, 1, 128), 8)).ok());
  ASSERT_TRUE(e->AddRequest(Greedy("second", RandomPrompt(12, 2, 128), 8)).ok());
  const auto second_added = std::chrono::steady_clock::now();  // after its AddRequest
  std::optional<std::chrono::steady_clock::time_point> first_done;
  std::map<std::string, double> queued;
  std::map<std::string, double> first_seen;
  while (e->HasUnfinished()) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok());
    for (const auto& out : *outs) {
      queued[out.id] = out.queue_seconds;
      first_seen.emplace(out.id, out.queue_seconds);
      if (out.id == "first" && out.finish != FinishReason::kNone) {
        first_done = std::chrono::steady_clock::now();  // the second is admitted after this
      }
    }
  }
  ASSERT_EQ(queued.size(), 2u);
  ASSERT_TRUE(first_done.has_value());
  EXPECT_EQ(queued["first"], first_seen["first"]);  // set once, at admission
  EXPECT_EQ(queued["second"], first_seen["second"]);
  EXPECT_GE(queued["second"], std::chrono::duration<double>(*first_done - second_added).count());
  EXPECT_GT(queued["second"], 0);
}

TEST_F(EngineTest, SeededSamplingIsReproducible) {
  auto sampled = [&](uint64_t seed) {
    Request r = Greedy("x", RandomPrompt(8, 3, 128), 32);
    r.sampling = {.temperature = 0.9f, .top_p = 0.95f, .top_k = 40, .seed = seed};
    return Solo(r).tokens;
  };
  EXPECT_EQ(sampled(123), sampled(123));
  EXPECT_NE(sampled(123), sampled(124));
}

// A request resumed with the tokens generated so far (decode after prefill, migration) must
// continue the very stream the uninterrupted request produces, greedy and seeded alike, and
// count the earlier tokens towards max_tokens.
TEST_F(EngineTest, ResumedRequestContinuesTheSameStream) {
  for (bool seeded : {false, true}) {
    Request whole = Greedy("w", RandomPrompt(21, 9, 128), 12);
    if (seeded) whole.sampling = {.temperature = 0.9f, .top_p = 0.9f, .seed = 77};
    const Result full = Solo(whole);
    ASSERT_EQ(full.tokens.size(), 12u);
    for (int done : {1, 5}) {
      Request resumed = whole;
      resumed.prompt.insert(resumed.prompt.end(), full.tokens.begin(), full.tokens.begin() + done);
      resumed.num_generated = done;
      auto e = MakeEngine(Options());
      ASSERT_TRUE(e->AddRequest(resumed).ok());
      std::vector<int32_t> rest;
      int completion = 0, prompt_tokens = 0;
      while (e->HasUnfinished()) {
        auto outs = e->Step();
        ASSERT_TRUE(outs.ok());
        for (const auto& o : *outs) {
          rest.insert(rest.end(), o.new_tokens.begin(), o.new_tokens.end());
          completion = o.completion_tokens;
          prompt_tokens = o.prompt_tokens;
        }
      }
      EXPECT_EQ(rest, std::vector<int32_t>(full.tokens.begin() + done, full.tokens.end()))
          << "seeded " << seeded << ", resumed after " << done;
      EXPECT_EQ(completion, 12);
      EXPECT_EQ(prompt_tokens, 21);
    }
  }
}

// With panel weights a resumed request (migration re-prefills the generated tokens in one
// prefill pass where they were first computed one decode step at a time) sees the very logits
// of the uninterrupted run, bit for bit: every kernel treats each row on its own, in one order.
// (With row-major weights it does not: the GEMV and the blocked GEMM sum in different orders.)
TEST_F(EngineTest, PanelWeightsMakeResumptionBitExact) {
  auto packed = model::Model::Load(dir_, pool_, {.memory = model::WeightMemory::kHugePages});
  ASSERT_TRUE(packed.ok()) << packed.status();
  const Request whole = Greedy("w", RandomPrompt(21, 9, 128), 12);
  const Result full = RunAll(*MakeEngine(Options(), packed->get()), {whole})["w"];
  ASSERT_EQ(full.logits.size(), 12u);
  for (int done : {1, 5}) {
    Request resumed = whole;
    resumed.prompt.insert(resumed.prompt.end(), full.tokens.begin(), full.tokens.begin() + done);
    resumed.num_generated = done;
    const Result rest = RunAll(*MakeEngine(Options(), packed->get()), {resumed})["w"];
    ASSERT_EQ(rest.logits.size(), 12u - done);
    for (size_t i = 0; i < rest.logits.size(); ++i) {
      EXPECT_EQ(rest.logits[i], full.logits[done + i])
          << "resumed after " << done << ", step " << i;
    }
  }
}

TEST_F(EngineTest, RejectsBadResumptions) {
  auto e = MakeEngine(Options());
  auto code = [&](std::vector<int32_t> prompt, int generated, int max_tokens) {
    Request r = Greedy("r", std::move(prompt), max_tokens);
    r.num_generated = generated;
    return e->AddRequest(std::move(r)).code();
  };
  EXPECT_EQ(code({1, 2, 3}, -1, 4), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1, 2, 3}, 3, 4), absl::StatusCode::kInvalidArgument);  // no prompt left
  EXPECT_EQ(code({1, 2, 3}, 2, 2), absl::StatusCode::kInvalidArgument);  // nothing to generate
  // The context holds 512: prompt 2 + max_tokens 510 fits even with 300 generated tokens.
  std::vector<int32_t> long_prompt(302, 1);
  EXPECT_EQ(code(long_prompt, 300, 510), absl::StatusCode::kOk);
}

void ExpectPromptLogprobs(EngineTest& t, const std::vector<int32_t>& prompt,
                          const std::vector<model::TokenLogprobs>& got, int top,
                          const std::string& what) {
  ASSERT_EQ(got.size(), prompt.size() - 1) << what;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const std::vector<int32_t> prefix(prompt.begin(), prompt.begin() + p + 1);
    const Result alone = t.SoloResult(Greedy("prefix", prefix, 1));
    ASSERT_EQ(alone.logits.size(), 1u);
    const std::vector<double> want = LogSoftmax(alone.logits[0]);
    EXPECT_NEAR(got[p].logprob, want[prompt[p + 1]], 1e-4) << what << " position " << p;
    ASSERT_EQ(got[p].top.size(), static_cast<size_t>(top)) << what;
    std::vector<int32_t> order(want.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return want[a] > want[b]; });
    for (int k = 0; k < top; ++k) {
      EXPECT_EQ(got[p].top[k].first, order[k]) << what << " position " << p << " top " << k;
      EXPECT_NEAR(got[p].top[k].second, want[order[k]], 1e-4) << what;
    }
  }
}

TEST_F(EngineTest, RejectsInvalidRequests) {
  auto e = MakeEngine(Options());
  auto code = [&](Request r) { return e->AddRequest(std::move(r)).code(); };
  EXPECT_EQ(code(Greedy("a", {}, 4)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Greedy("b", {1, 128}, 4)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Greedy("c", {1, -1}, 4)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Greedy("d", {1, 2}, 0)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Greedy("e", {1, 2}, 511)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Greedy("f", std::vector<int32_t>(512, 1), 1)), absl::StatusCode::kInvalidArgument);
  Request hot = Greedy("g", {1, 2}, 4);
  hot.sampling.temperature = -1;
  EXPECT_EQ(code(hot), absl::StatusCode::kInvalidArgument);
  Request top_p = Greedy("h", {1, 2}, 4);
  top_p.sampling.top_p = 1.5f;
  EXPECT_EQ(code(top_p), absl::StatusCode::kInvalidArgument);
  Request many = Greedy("i", {1, 2}, 4);
  many.prompt_logprobs = model::SamplingParams::kMaxLogprobs + 1;
  EXPECT_EQ(code(many), absl::StatusCode::kInvalidArgument);
  Request resumed = Greedy("j", {1, 2, 3}, 4);
  resumed.num_generated = 1;
  resumed.prompt_logprobs = 0;  // the prompt was prefilled before: its logprobs went out then
  EXPECT_EQ(code(resumed), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(e->AddRequest(Greedy("dup", {1, 2}, 4)).ok());
  EXPECT_EQ(code(Greedy("dup", {1, 2}, 4)), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(e->NumWaiting(), 1);
}

}  // namespace
}  // namespace tandem::engine

namespace tandem::engine {
namespace {

// Prefill-only pruning (POP) through the engine, on a 3-layer model with layers 1 and 2 pruned
// (pruning only the last layer would change no logits: later layers read pruned K/V).
class EnginePruningTest : public EngineTest {
 protected:
  void SetUp() override {
    auto spec = testing::TinySpec();
    spec.layers = 3;
    dir_ = testing::WriteTempModel(spec);
    ASSERT_FALSE(dir_.empty());
    auto m = model::Model::Load(dir_, pool_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  EngineOptions Pruning(int min_batch_size) const {
    EngineOptions o = Options();
    o.pruning.enabled = true;
    o.pruning.settings.start_layer = 1;
    o.pruning.min_batch_size = min_batch_size;
    return o;
  }

  // The last-token logits of `prompt` prefilled alone through Model::Forward with layers 1 and
  // 2 pruned for every token but the last.
  std::vector<float> PrunedLastLogits(const std::vector<int32_t>& prompt) {
    kv::KvCacheOptions o;
    o.layout = model_->config().KvLayoutFor(DType::kF32, 16);
    o.num_blocks = 16;
    o.model_id = "reference";
    o.enable_prefix_caching = false;
    auto kv = kv::KvCacheManager::Create(o);
    EXPECT_TRUE(kv.ok());
    EXPECT_TRUE((*kv)->AddSequence(1, prompt).ok());
    EXPECT_TRUE((*kv)->Reserve(1, static_cast<int>(prompt.size())).ok());
    model::ForwardSequence seq{prompt.data(), static_cast<int>(prompt.size()), 0,
                               (*kv)->BlockTableData(1), model::LogitsMode::kLast};
    const std::vector<uint8_t> layers = {0, 1, 1};
    std::vector<uint8_t> full(prompt.size(), 0);
    full.back() = 1;
    model::PruningPlan plan{layers, full};
    std::vector<float> logits;
    EXPECT_TRUE(
        model_->Forward({&seq, 1}, (*kv)->pool_base(), (*kv)->layout(), logits, &plan).ok());
    return logits;
  }
};

TEST_F(EnginePruningTest, BatchesOfMinSizePruneTheirPromptsAndOnlyThem) {
  const std::vector<Request> requests = {Greedy("a", RandomPrompt(20, 1, 128), 3),
                                         Greedy("b", RandomPrompt(13, 2, 128), 3)};
  auto pruning = MakeEngine(Pruning(2));
  auto pruned = RunAll(*pruning, requests);
  auto plain_engine = MakeEngine(Options());
  auto plain = RunAll(*plain_engine, requests);
  for (const auto& r : requests) {
    // The first token comes from the pruned prefill, exactly as Model::Forward computes it.
    EXPECT_LE(MaxRelDiff(PrunedLastLogits(r.prompt), pruned[r.id].logits[0]), 1e-4) << r.id;
    EXPECT_GT(MaxRelDiff(plain[r.id].logits[0], pruned[r.id].logits[0]), 1e-3) << r.id;
  }
  // One sequence short of min_batch_size: nothing is pruned.
  auto too_few = MakeEngine(Pruning(3));
  auto unpruned = RunAll(*too_few, requests);
  for (const auto& r : requests) {
    EXPECT_EQ(unpruned[r.id].tokens, plain[r.id].tokens) << r.id;
    EXPECT_LE(MaxRelDiff(plain[r.id].logits[0], unpruned[r.id].logits[0]), 1e-5) << r.id;
  }
  EXPECT_EQ(pruning->KvStats().used_blocks, 0);
}

TEST_F(EnginePruningTest, PromptLogprobsRunTheirPromptAtFullDepth) {
  const std::vector<Request> plain_requests = {Greedy("a", RandomPrompt(20, 1, 128), 3),
                                               Greedy("b", RandomPrompt(13, 2, 128), 3)};
  std::vector<Request> requests = plain_requests;
  requests[0].prompt_logprobs = 1;
  auto pruning = MakeEngine(Pruning(1));
  auto got = RunAll(*pruning, requests);
  auto plain_engine = MakeEngine(Options());
  auto plain = RunAll(*plain_engine, plain_requests);
  // "a" asked for its prompt's log-probabilities: nothing of it was pruned; "b" was.
  EXPECT_LE(MaxRelDiff(plain["a"].logits[0], got["a"].logits[0]), 1e-5);
  EXPECT_LE(MaxRelDiff(PrunedLastLogits(requests[1].prompt), got["b"].logits[0]), 1e-4);
  ASSERT_EQ(got["a"].prompt_logprobs.size(), requests[0].prompt.size() - 1);
  EXPECT_TRUE(got["b"].prompt_logprobs.empty());
}

TEST_F(EnginePruningTest, PrunedBlocksAreSharedOnlyByTheSamePrompt) {
  auto e = MakeEngine(Pruning(1));
  const std::vector<int32_t> prompt = RandomPrompt(40, 3, 128);
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 32);
  other.push_back(5);
  auto first = RunAll(*e, {Greedy("a", prompt, 2)});
  EXPECT_EQ(first["a"].cached_prompt_tokens, 0);
  auto again = RunAll(*e, {Greedy("b", prompt, 2)});
  EXPECT_EQ(again["b"].cached_prompt_tokens, 32);
  EXPECT_EQ(again["b"].tokens, first["a"].tokens);
  // Same first 32 tokens, another prompt: its pruned KV would differ, so nothing is shared.
  auto shared_prefix = RunAll(*e, {Greedy("c", other, 2)});
  EXPECT_EQ(shared_prefix["c"].cached_prompt_tokens, 0);
}

}  // namespace
}  // namespace tandem::engine
