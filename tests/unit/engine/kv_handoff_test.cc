// Disaggregation's central property: prefill on one engine, hand the full prompt blocks over
// as bytes, continue on another engine — and get the tokens a single engine produces.
#include "common/engine/kv_handoff.h"

#include <gtest/gtest.h>

#include "tests/unit/testing/serving.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::engine {
namespace {

class KvHandoffTest : public testing::TinyModelTest {
 protected:
  void SetUp() override {
    TinyModelTest::SetUp();
    for (int i = 0; i < 45; ++i) prompt_.push_back((i * 53 + 7) % 128);  // 2 full blocks + 13
  }

  Request Make(std::vector<int32_t> prompt, int max_tokens, int num_generated = 0) {
    return testing::GreedyRequest("r", std::move(prompt), max_tokens, num_generated);
  }

  // Runs `r` to completion; returns its tokens and the first output's cached prompt tokens.
  std::pair<std::vector<int32_t>, int> Run(Engine& e, Request r) {
    testing::RunResult result = testing::RunToCompletion(e, std::move(r));
    return {result.tokens, result.cached_prompt_tokens};
  }

  std::vector<int32_t> prompt_;
};

TEST_F(KvHandoffTest, DecodeOnAnotherEngineContinuesExactly) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, Make(prompt_, 10)).first;

  auto prefill = MakeEngine();
  const auto [first, cached_on_prefill] = Run(*prefill, Make(prompt_, 1));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0], expected[0]);
  auto exported = ExportPromptBlocks(*prefill, prompt_);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), 2u);  // the partial third block stays behind

  auto decode = MakeEngine();
  std::vector<kv::BlockHash> hashes = PromptBlockHashes(*decode, prompt_);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_EQ(hashes[0], (*exported)[0].hash);
  std::vector<std::optional<std::string>> blobs = {(*exported)[0].bytes, (*exported)[1].bytes};
  const ImportStats stats = ImportPromptBlocks(*decode, hashes, blobs);
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.misses, 0);

  std::vector<int32_t> resumed = prompt_;
  resumed.push_back(first[0]);
  const auto [rest, cached] = Run(*decode, Make(resumed, 10, 1));
  EXPECT_EQ(cached, 32);  // both imported blocks were used
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));

  // A second import of the same blocks finds them resident.
  EXPECT_EQ(ImportPromptBlocks(*decode, hashes, blobs).hits, 2);
}

// The plan a prefill worker reserves store space with: the export's hashes (under a request's
// salt too) and each block's exact size, known before the prompt is computed.
TEST_F(KvHandoffTest, ExportPlanKnowsTheBlocksBeforeTheyAreComputed) {
  auto e = MakeEngine();
  const ExportPlan plan = ExportPlan::Of(*e);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 50; ++i) prompt.push_back((i * 13 + 7) % 128);  // 3 full blocks + 2
  for (uint64_t salt : {uint64_t{0}, uint64_t{77}}) {
    const std::vector<kv::BlockHash> hashes = plan.Hashes(prompt, salt);
    EXPECT_EQ(hashes, PromptBlockHashes(*e, prompt, salt));
    Request r = Make(prompt, 1);
    r.cache_salt = salt;
    Run(*e, r);
    auto exported = ExportPromptBlocks(*e, prompt, salt);
    ASSERT_TRUE(exported.ok());
    ASSERT_EQ(exported->size(), hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      EXPECT_EQ((*exported)[i].hash, hashes[i]);
      EXPECT_EQ(static_cast<int64_t>((*exported)[i].bytes.size()), plan.block_bytes());
    }
  }
}

// kv_cache.dtype mixed on both sides: prefill exports its int8 blocks (behind the window) and
// fp16 ones as they are, and decode requantizes the fp16 ones as its sequence grows past them.
TEST_F(KvHandoffTest, MixedCachesHandOverEachBlockInItsOwnDtype) {
  EngineOptions o;
  o.kv_dtype = DType::kF16;
  o.num_blocks = 64;
  o.mixed_kv = {.enabled = true, .sink_tokens = 4, .window_tokens = 16};
  auto make = [&] { return std::move(Engine::Create(*model_, o)).value(); };
  std::vector<int32_t> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back((i * 37 + 11) % 128);  // 6 full blocks + 4

  auto prefill = make();
  const std::vector<int32_t> first = Run(*prefill, Make(prompt, 1)).first;
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(prefill->KvStats().narrowed, 4);  // blocks 1..4, behind 100 - 16 = 84
  auto exported = ExportPromptBlocks(*prefill, prompt);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), 6u);

  auto decode = make();
  std::vector<kv::BlockHash> hashes = PromptBlockHashes(*decode, prompt);
  std::vector<std::optional<std::string>> blobs;
  for (const ExportedBlock& b : *exported) blobs.push_back(b.bytes);
  EXPECT_EQ(ImportPromptBlocks(*decode, hashes, blobs).hits, 6);
  // Int8 blocks travel at int8 size.
  EXPECT_LT((*exported)[1].bytes.size(), (*exported)[0].bytes.size() * 6 / 10);
  // So their sizes are not known ahead: the plan says so, and prefill reserves nothing early.
  const ExportPlan plan = ExportPlan::Of(*prefill);
  EXPECT_EQ(plan.block_bytes(), 0);
  EXPECT_EQ(plan.Hashes(prompt, 0), PromptBlockHashes(*prefill, prompt));

  std::vector<int32_t> resumed = prompt;
  resumed.push_back(first[0]);
  const auto [rest, cached] = Run(*decode, Make(resumed, 40, 1));
  EXPECT_EQ(cached, 96);
  EXPECT_EQ(rest.size(), 39u);
  // 139 tokens computed (the last one sampled is not fed back): blocks 5 and 6, imported in
  // fp16, fall behind 139 - 16 = 123; block 7 ends at 128.
  EXPECT_EQ(decode->KvStats().narrowed, 2);
}

TEST_F(KvHandoffTest, MissingOrForeignBlocksAreMissesAndStillDecodeCorrectly) {
  auto whole = MakeEngine(DType::kF16);
  const std::vector<int32_t> expected = Run(*whole, Make(prompt_, 6)).first;

  auto prefill = MakeEngine();  // fp32 KV: its blocks do not fit an fp16 cache
  ASSERT_EQ(Run(*prefill, Make(prompt_, 1)).first.size(), 1u);
  auto exported = ExportPromptBlocks(*prefill, prompt_);
  ASSERT_TRUE(exported.ok());

  auto decode = MakeEngine(DType::kF16);
  const auto hashes = PromptBlockHashes(*decode, prompt_);
  std::vector<std::optional<std::string>> foreign = {(*exported)[0].bytes, (*exported)[1].bytes};
  ImportStats stats = ImportPromptBlocks(*decode, hashes, foreign);
  EXPECT_EQ(stats.hits, 0);
  EXPECT_EQ(stats.misses, 2);
  EXPECT_EQ(decode->KvStats().cached_blocks, 0);  // nothing was imported

  std::vector<int32_t> resumed = prompt_;
  resumed.push_back(expected[0]);
  const auto [rest, cached] = Run(*decode, Make(resumed, 6, 1));
  EXPECT_EQ(cached, 0);  // recomputed
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));

  // Same-dtype blocks with the second one missing: one hit, one miss.
  auto fresh = MakeEngine();
  std::vector<std::optional<std::string>> partial = {(*exported)[0].bytes, std::nullopt};
  stats = ImportPromptBlocks(*fresh, PromptBlockHashes(*fresh, prompt_), partial);
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  // A corrupt block is refused.
  auto other = MakeEngine();
  std::string corrupt = (*exported)[0].bytes;
  corrupt[corrupt.size() / 2] ^= 0x5a;
  std::vector<std::optional<std::string>> bad = {corrupt, (*exported)[1].bytes};
  EXPECT_EQ(ImportPromptBlocks(*other, PromptBlockHashes(*other, prompt_), bad).hits, 0);
}

}  // namespace
}  // namespace tandem::engine
