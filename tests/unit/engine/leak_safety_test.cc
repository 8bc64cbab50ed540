// The seed's chunked-cache leak checks (its §5.2), on the engine: long prompts prefilled in
// chunks do not grow the process, blocks freed by one batch serve the next, no padding ever
// takes a block, and every way a request ends gives its blocks back.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/kv_helpers.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::engine {
namespace {

constexpr int kBlock = 16;

std::vector<int32_t> RandomPrompt(int len, uint32_t seed) {
  return testing::RandomTokens(len, seed);
}

// Resident set size of this process, in bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int BlocksFor(int tokens) { return (tokens + kBlock - 1) / kBlock; }

class LeakSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    make_random_model::ModelSpec spec = testing::TinySpec();
    spec.max_pos = 4096;  // room for 2048-token prompts
    dir_ = testing::WriteTempModel(spec);
    ASSERT_FALSE(dir_.empty());
    auto m = model::Model::Load(dir_, pool_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  std::unique_ptr<Engine> MakeEngine(int64_t num_blocks, int chunk_size = 512) {
    EngineOptions o;
    o.block_size = kBlock;
    o.kv_dtype = DType::kF16;
    o.num_blocks = num_blocks;
    o.chunk_size = chunk_size;
    o.max_num_batched_tokens = 2048;
    auto e = Engine::Create(*model_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static Request Greedy(std::string id, std::vector<int32_t> prompt, int max_tokens) {
    Request r;
    r.id = std::move(id);
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Steps until nothing is left; the most blocks in use at once.
  static int64_t RunAll(Engine& e) {
    int64_t peak = 0;
    while (e.HasUnfinished()) {
      auto outs = e.Step();
      EXPECT_TRUE(outs.ok()) << outs.status();
      if (!outs.ok()) break;
      peak = std::max(peak, e.KvStats().used_blocks);
    }
    return peak;
  }

  static void ExpectBaseline(Engine& e) {
    const kv::KvCacheStats s = e.KvStats();
    EXPECT_EQ(s.used_blocks, 0);
    EXPECT_EQ(s.free_blocks + s.cached_blocks, s.total_blocks);
  }

  ThreadPool pool_{2};
  std::string dir_;
  std::unique_ptr<model::Model> model_;
};

// Ten 2048-token prompts prefilled in 1024-token chunks, 32 tokens generated each: the pool is
// back to baseline after every one and the process grows by less than 10% after the first
// (which sizes the engine's scratch buffers).
TEST_F(LeakSafetyTest, LongChunkedGenerationsKeepMemoryFlat) {
  auto e = MakeEngine(BlocksFor(2048 + 32) + 8, /*chunk_size=*/1024);
  ASSERT_NE(e, nullptr);
  int64_t after_first = 0;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(
        e->AddRequest(Greedy("g" + std::to_string(i), RandomPrompt(2048, 100 + i), 32)).ok());
    const int64_t peak = RunAll(*e);
    EXPECT_EQ(peak, BlocksFor(2048 + 32 - 1)) << i;  // the last token's KV is never written
    ExpectBaseline(*e);
    if (i == 0) after_first = ResidentBytes();
  }
  const int64_t after_last = ResidentBytes();
  EXPECT_LT(after_last, after_first * 11 / 10)
      << "RSS " << after_first << " -> " << after_last << " bytes over nine generations";
}

// A pool sized for exactly eight sequences runs a batch of eight, then a batch of two new ones
// in the blocks the eight gave back, without the process growing.
TEST_F(LeakSafetyTest, BlocksFreedByABatchOfEightServeABatchOfTwo) {
  constexpr int kPrompt = 200, kGen = 40;
  const int per_seq = BlocksFor(kPrompt + kGen - 1);
  auto e = MakeEngine(8 * per_seq);
  ASSERT_NE(e, nullptr);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(
        e->AddRequest(Greedy("a" + std::to_string(i), RandomPrompt(kPrompt, i), kGen)).ok());
  }
  EXPECT_EQ(RunAll(*e), 8 * per_seq);
  ExpectBaseline(*e);
  const int64_t rss = ResidentBytes();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        e->AddRequest(Greedy("b" + std::to_string(i), RandomPrompt(kPrompt, 50 + i), kGen)).ok());
  }
  EXPECT_EQ(RunAll(*e), 2 * per_seq);
  ExpectBaseline(*e);
  EXPECT_LE(ResidentBytes(), rss + rss / 100);
}

// Sequences of different lengths batched together each take exactly the blocks their own
// tokens need, and only full blocks of real tokens enter the prefix index.
TEST_F(LeakSafetyTest, PaddingNeverEntersTheCache) {
  auto e = MakeEngine(256);
  ASSERT_NE(e, nullptr);
  const std::vector<int> lengths = {1, 15, 16, 17, 33, 100};
  int expect_used = 0;
  size_t expect_indexed = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_TRUE(
        e->AddRequest(Greedy("p" + std::to_string(i), RandomPrompt(lengths[i], 200 + i), 2)).ok());
    expect_used += BlocksFor(lengths[i]);
    expect_indexed += lengths[i] / kBlock;
  }
  auto outs = e->Step();  // every prompt fits one step: all prefilled, one token sampled each
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), lengths.size());
  EXPECT_EQ(e->KvStats().used_blocks, expect_used);
  EXPECT_EQ(e->kv_cache().IndexedHashes().size(), expect_indexed);
  RunAll(*e);
  ExpectBaseline(*e);
}

// Finished by max_tokens, by a stop token, aborted while prefilling, aborted while decoding:
// all the blocks come back, and a request refused at AddRequest never took any.
TEST_F(LeakSafetyTest, EveryEndingReleasesItsBlocks) {
  auto e = MakeEngine(256, /*chunk_size=*/64);
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(e->AddRequest(Greedy("length", RandomPrompt(40, 1), 20)).ok());
  Request stop = Greedy("stop", RandomPrompt(40, 2), 200);
  for (int t = 0; t < 128; ++t) stop.stop_token_ids.push_back(t);  // the first token stops it
  ASSERT_TRUE(e->AddRequest(std::move(stop)).ok());
  ASSERT_TRUE(e->AddRequest(Greedy("abort-prefill", RandomPrompt(1000, 3), 20)).ok());
  ASSERT_TRUE(e->AddRequest(Greedy("abort-decode", RandomPrompt(20, 4), 500)).ok());
  EXPECT_FALSE(e->AddRequest(Greedy("refused", {5000}, 4)).ok());  // id outside the vocabulary
  std::map<std::string, FinishReason> finish;
  for (int step = 0; e->HasUnfinished(); ++step) {
    if (step == 1) e->Abort("abort-prefill");  // 64 of its 1000 prompt tokens are in
    if (step == 5) e->Abort("abort-decode");
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    for (const auto& out : *outs) {
      if (out.finish != FinishReason::kNone) finish[out.id] = out.finish;
    }
  }
  EXPECT_EQ(finish["length"], FinishReason::kLength);
  EXPECT_EQ(finish["stop"], FinishReason::kStop);
  EXPECT_EQ(finish["abort-prefill"], FinishReason::kAbort);
  EXPECT_EQ(finish["abort-decode"], FinishReason::kAbort);
  EXPECT_EQ(finish.count("refused"), 0u);
  ExpectBaseline(*e);
}

}  // namespace
}  // namespace tandem::engine
