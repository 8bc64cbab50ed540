// The engine on a backend whose memory is not the host's (testing::DeviceLikeBackend: the CPU
// kernels behind a device's memory rules): its KV pool lives in backend memory, and every path
// that touches blocks from the host (logits, prefix reuse, mixed-precision narrowing, semantic
// eviction, export to and import from the store) goes through copies. Each must give exactly
// what the CPU backend gives.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_transfer.h"
#include "gtest/gtest.h"
#include "tests/unit/testing/device_like_backend.h"
#include "tests/unit/testing/engine_run.h"
#include "tests/unit/testing/kv_helpers.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::engine {
namespace {

using Result = testing::EngineResult;
using testing::Greedy;
using testing::RunAll;

class DevicePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::WriteTempModel(testing::TinySpec());
    ASSERT_FALSE(dir_.empty());
    cpu_ = model::Model::Load(dir_, pool_, {.memory = model::WeightMemory::kMmap}).value();
    device_ = testing::LoadDeviceLikeModel(dir_, pool_).value();
    ASSERT_EQ(device_->kv_memory() != nullptr, true);
    ASSERT_EQ(cpu_->kv_memory(), nullptr);
  }

  testing::DeviceLikeBackend& backend() {
    return static_cast<testing::DeviceLikeBackend&>(device_->backend());
  }

  // Requests that share prefixes (a prefix hit on the second wave), and a long one.
  std::vector<Request> Requests(const std::string& tag) const {
    const std::vector<int32_t> shared = testing::RandomTokens(40, 5, 128);
    std::vector<Request> rs;
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> p = shared;
      const auto tail = testing::RandomTokens(7 + 5 * i, 100 + i, 128);
      p.insert(p.end(), tail.begin(), tail.end());
      rs.push_back(Greedy(tag + std::to_string(i), p, 24));
    }
    rs.push_back(Greedy(tag + "long", testing::RandomTokens(300, 9, 128), 40));
    return rs;
  }

  void ExpectSameResults(const EngineOptions& options, const std::string& what) {
    SCOPED_TRACE(what);
    auto cpu = Engine::Create(*cpu_, options).value();
    auto dev = Engine::Create(*device_, options).value();
    for (const std::string wave : {"a", "b"}) {  // the second wave hits the prefix cache
      const auto want = RunAll(*cpu, Requests(wave));
      const auto got = RunAll(*dev, Requests(wave));
      ASSERT_EQ(want.size(), 4u);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [id, w] : want) {
        const Result& g = got.at(id);
        EXPECT_EQ(g.tokens, w.tokens) << id;
        EXPECT_EQ(g.logits, w.logits) << id << ": the same kernels give the same bits";
        EXPECT_EQ(g.cached_prompt_tokens, w.cached_prompt_tokens) << id;
      }
    }
    EXPECT_EQ(dev->KvStats().narrowed, cpu->KvStats().narrowed);
    EXPECT_EQ(dev->KvStats().hits, cpu->KvStats().hits);
  }

  EngineOptions Options(DType kv_dtype) const {
    EngineOptions o;
    o.kv_dtype = kv_dtype;
    o.num_blocks = 128;
    o.block_size = 8;
    o.chunk_size = 64;
    return o;
  }

  ThreadPool pool_{2};
  std::string dir_;
  std::unique_ptr<model::Model> cpu_, device_;
};

TEST_F(DevicePoolTest, ServesTheCpusTokensInEveryKvDtype) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
    ExpectSameResults(Options(dtype), std::string(DTypeName(dtype)));
  }
  EXPECT_GT(backend().copies_to_host(), 0) << "logits come back through copies";
}

TEST_F(DevicePoolTest, MixedPrecisionNarrowsBlocksInDeviceMemory) {
  EngineOptions o = Options(DType::kF16);
  o.mixed_kv = {.enabled = true, .sink_tokens = 4, .window_tokens = 16, .wide_blocks = 24};
  const int64_t writes_before = backend().copies_from_host();
  ExpectSameResults(o, "mixed");
  auto probe = Engine::Create(*device_, o).value();
  RunAll(*probe, {Greedy("n", testing::RandomTokens(200, 3, 128), 8)});
  EXPECT_GT(probe->KvStats().narrowed, 0);
  EXPECT_GT(backend().copies_from_host(), writes_before) << "narrowed blocks are written back";
}

TEST_F(DevicePoolTest, SemanticEvictionReadsKeysFromDeviceMemory) {
  EngineOptions o = Options(DType::kBF16);
  o.kv_eviction = {.budget_tokens = 96, .sink_tokens = 4, .semantic = true, .chunk_tokens = 16};
  ExpectSameResults(o, "semantic eviction");
}

TEST_F(DevicePoolTest, BlocksCrossBetweenDeviceAndHostPoolsUnchanged) {
  const EngineOptions o = Options(DType::kBF16);
  auto cpu = Engine::Create(*cpu_, o).value();
  auto dev = Engine::Create(*device_, o).value();
  const std::vector<int32_t> prompt = testing::RandomTokens(64, 21, 128);
  RunAll(*cpu, {Greedy("p", prompt, 1)});
  RunAll(*dev, {Greedy("p", prompt, 1)});
  auto exported = [&](Engine& e) {
    kv::KvCacheManager& kv = e.kv_cache();
    const auto hashes = kv::HashPrefixBlocks(kv.model_hash(), prompt, o.block_size);
    const std::vector<int32_t> ids = kv.FindCachedPrefix(hashes);
    EXPECT_EQ(ids.size(), hashes.size());
    return kv::ExportBlocks(kv, ids,
                            std::vector<kv::BlockHash>(hashes.begin(), hashes.begin() + ids.size()))
        .value();
  };
  const int64_t reads_before = backend().copies_to_host();
  const std::string from_dev = exported(*dev);
  EXPECT_EQ(backend().copies_to_host() - reads_before, 64 / o.block_size)
      << "each exported block is copied out of device memory once";
  EXPECT_EQ(from_dev, exported(*cpu)) << "device blocks export as the CPU's bytes";

  // Imported into device memory, they serve a request as a prefix hit with the CPU's tokens.
  auto fresh = Engine::Create(*device_, o).value();
  const int64_t writes_before = backend().copies_from_host();
  auto imported = kv::ImportBlocks(fresh->kv_cache(), from_dev);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->imported, 64 / o.block_size);
  EXPECT_EQ(backend().copies_from_host() - writes_before, 64 / o.block_size);
  std::vector<int32_t> longer = prompt;
  longer.push_back(7);
  const Result got = RunAll(*fresh, {Greedy("q", longer, 12)}).at("q");
  const Result want = RunAll(*cpu, {Greedy("q", longer, 12)}).at("q");
  EXPECT_EQ(got.cached_prompt_tokens, 64);
  EXPECT_EQ(got.tokens, want.tokens);
}

}  // namespace
}  // namespace tandem::engine
