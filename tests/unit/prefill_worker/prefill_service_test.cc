// The prefill worker as a real gRPC service over a real cache-store shard: the first token and
// the KV handle it returns let another engine continue exactly; bad requests, deadlines and
// cancellation end cleanly and leave no block behind.
#include "prefill_worker/prefill_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache_store/cache_store_service.h"
#include "common/engine/kv_handoff.h"
#include "tests/unit/testing/serving.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::prefill {
namespace {

class PrefillServiceTest : public testing::TinyModelTest {
 protected:
  void SetUp() override {
    TinyModelTest::SetUp();
    for (int i = 0; i < 70; ++i) prompt_.push_back((i * 41 + 5) % 128);  // 4 full blocks + 6

    block_store_ = cache_store::BlockStore::Create({.capacity_bytes = 64 << 20}).value();
    store_service_ = std::make_unique<cache_store::CacheStoreService>(*block_store_, 4096);
    loop_ = std::make_unique<engine::EngineLoop>(MakeEngine());
    std::string store_address, address;
    store_server_ = testing::ServeOnLoopback(store_service_.get(), &store_address);
    store_pool_ =
        std::make_unique<store::StorePool>(std::vector<std::string>{store_address}, "tiny");
    service_ = std::make_unique<PrefillService>(*loop_, *store_pool_);
    server_ = testing::ServeOnLoopback(service_.get(), &address);
    stub_ = tandem::v1::PrefillWorker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    server_->Shutdown();
    loop_.reset();  // before the service: delivers the last callbacks
    service_.reset();
    store_server_->Shutdown();
  }

  grpc::Status Call(const tandem::v1::PrefillRequest& request,
                    tandem::v1::PrefillResponse* response, int deadline_ms = 60000) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    return stub_->Prefill(&context, request, response);
  }

  tandem::v1::PrefillRequest Request(const std::vector<int32_t>& tokens) {
    tandem::v1::PrefillRequest r;
    for (int32_t t : tokens) r.add_token_ids(t);
    r.mutable_sampling()->set_max_tokens(8);
    return r;
  }

  int64_t UsedBlocks() { return testing::UsedBlocks(*loop_); }

  // Serves a fresh engine (an empty prefix cache) in place of the fixture's, with `options`.
  void Restart(const PrefillServiceOptions& options) {
    server_->Shutdown();
    loop_.reset();
    service_.reset();
    loop_ = std::make_unique<engine::EngineLoop>(MakeEngine());
    service_ = std::make_unique<PrefillService>(*loop_, *store_pool_, options);
    std::string address;
    server_ = testing::ServeOnLoopback(service_.get(), &address);
    stub_ = tandem::v1::PrefillWorker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  // Serves a pruning engine (layers 1.. pruned at any batch) in place of the fixture's, with
  // `options`; with `reserve_ahead`, the engine's ExportPlan too.
  void RestartPruning(PrefillServiceOptions options, bool reserve_ahead = false) {
    server_->Shutdown();
    loop_.reset();
    service_.reset();
    engine::EngineOptions o;
    o.kv_dtype = DType::kF32;
    o.num_blocks = 64;
    o.pruning.enabled = true;
    o.pruning.settings = {.start_layer = 1};
    o.pruning.min_batch_size = 1;
    auto engine = engine::Engine::Create(*model_, o).value();
    if (reserve_ahead) options.reserve_ahead = engine::ExportPlan::Of(*engine);
    loop_ = std::make_unique<engine::EngineLoop>(std::move(engine));
    service_ = std::make_unique<PrefillService>(*loop_, *store_pool_, options);
    std::string address;
    server_ = testing::ServeOnLoopback(service_.get(), &address);
    stub_ = tandem::v1::PrefillWorker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  std::vector<int32_t> prompt_;
  std::unique_ptr<cache_store::BlockStore> block_store_;
  std::unique_ptr<cache_store::CacheStoreService> store_service_;
  std::unique_ptr<grpc::Server> store_server_;
  std::unique_ptr<store::StorePool> store_pool_;
  std::unique_ptr<engine::EngineLoop> loop_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<tandem::v1::PrefillWorker::Stub> stub_;
};

TEST_F(PrefillServiceTest, HandleLetsAnotherEngineContinueExactly) {
  // The reference: one engine doing everything.
  auto whole = MakeEngine();
  const engine::Request r = testing::GreedyRequest("w", prompt_, 6);
  const std::vector<int32_t> expected = testing::RunToCompletion(*whole, r).tokens;

  tandem::v1::PrefillResponse response;
  grpc::Status s = Call(Request(prompt_), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.first_token(), expected[0]);
  const tandem::v1::KvHandle& kv = response.kv();
  EXPECT_EQ(kv.block_hashes_size(), 4);
  EXPECT_EQ(kv.locations_size(), 4);
  EXPECT_EQ(kv.num_tokens(), 64);
  EXPECT_EQ(kv.layout().block_size(), 16);
  EXPECT_EQ(kv.layout().dtype(), "fp32");
  EXPECT_EQ(block_store_->Stats().blocks, 4);
  EXPECT_EQ(UsedBlocks(), 0);  // the prefill engine keeps nothing in use

  // Decode elsewhere from the handle alone.
  auto decode = MakeEngine();
  std::vector<uint64_t> hashes(kv.block_hashes().begin(), kv.block_hashes().end());
  const auto stats = engine::ImportPromptBlocks(*decode, hashes, store_pool_->Get(hashes));
  EXPECT_EQ(stats.hits, 4);
  engine::Request cont = r;
  cont.prompt.push_back(response.first_token());
  cont.num_generated = 1;
  const std::vector<int32_t> rest = testing::RunToCompletion(*decode, cont).tokens;
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));

  // The same prompt again: the prefix cache serves it and nothing is uploaded twice.
  tandem::v1::PrefillResponse again;
  ASSERT_TRUE(Call(Request(prompt_), &again).ok());
  EXPECT_EQ(again.first_token(), expected[0]);
  EXPECT_EQ(again.cached_prompt_tokens(), 64);
  EXPECT_EQ(block_store_->Stats().puts, 4);
}

// load_prefixes: a worker with an empty cache imports what another worker stored and computes
// only the rest, with the first token it would have computed; another tenant's salt finds
// nothing.
TEST_F(PrefillServiceTest, ImportsAStoredPrefixAndComputesOnlyTheRest) {
  tandem::v1::PrefillResponse first;
  ASSERT_TRUE(Call(Request(prompt_), &first).ok());  // the fixture's worker stores 4 blocks
  ASSERT_EQ(block_store_->Stats().blocks, 4);

  PrefillServiceOptions options;
  options.load_prefixes = true;
  // tandem_prefix_lookup_seconds: one observation per prompt looked up, before it computes.
  auto lookups = std::make_shared<std::atomic<int>>(0);
  options.on_prefix_lookup = [lookups](double seconds) {
    EXPECT_GE(seconds, 0);
    EXPECT_LT(seconds, 60);
    ++*lookups;
  };
  Restart(options);
  std::vector<int32_t> longer = prompt_;
  for (int i = 0; i < 30; ++i) longer.push_back((i * 13 + 3) % 128);  // 6 full blocks + 4
  auto whole = MakeEngine();
  for (const auto& p : {prompt_, longer}) {
    const int32_t want =
        testing::RunToCompletion(*whole, testing::GreedyRequest("w", p, 1)).tokens[0];
    tandem::v1::PrefillResponse response;
    ASSERT_TRUE(Call(Request(p), &response).ok());
    EXPECT_EQ(response.first_token(), want) << p.size();
  }
  EXPECT_EQ(service_->loaded_blocks(), 4);   // the second prompt found them resident
  EXPECT_EQ(block_store_->Stats().puts, 6);  // only the longer prompt's two new blocks
  tandem::v1::PrefillRequest other = Request(prompt_);
  other.set_cache_salt(7);
  tandem::v1::PrefillResponse response;
  ASSERT_TRUE(Call(other, &response).ok());
  EXPECT_EQ(response.cached_prompt_tokens(), 0);
  EXPECT_EQ(service_->loaded_blocks(), 4);
  EXPECT_EQ(UsedBlocks(), 0);
  // Lookups: the first prompt's 4 blocks from the store's memory; the longer one's 4 resident
  // and 2 missing; the other tenant's 4 missing.
  EXPECT_TRUE(service_->counts_lookups());
  EXPECT_EQ(service_->kv_store_memory_hits(), 4);
  EXPECT_EQ(service_->kv_store_disk_hits(), 0);
  EXPECT_EQ(service_->kv_worker_hits(), 4);
  EXPECT_EQ(service_->kv_hits(), 8);
  EXPECT_EQ(service_->kv_misses(), 6);
  EXPECT_EQ(lookups->load(), 3);  // each prompt's, observed before its response
}

TEST_F(PrefillServiceTest, BadRequestsAreInvalidArgument) {
  tandem::v1::PrefillResponse response;
  EXPECT_EQ(Call(Request({}), &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Call(Request({1, 500}), &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto hot = Request({1, 2, 3});
  hot.mutable_sampling()->set_temperature(-1);
  EXPECT_EQ(Call(hot, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(UsedBlocks(), 0);
}

TEST_F(PrefillServiceTest, ExpiredCallsLeaveNothingBehind) {
  std::vector<int32_t> long_prompt(400);
  for (int i = 0; i < 400; ++i) long_prompt[i] = (i * 7) % 128;
  for (int i = 0; i < 5; ++i) {
    tandem::v1::PrefillResponse response;
    grpc::Status s = Call(Request(long_prompt), &response, /*deadline_ms=*/1);
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_message();
  }
  // Whatever was in flight has been aborted or finished: the engine holds no block.
  tandem::v1::PrefillResponse response;
  ASSERT_TRUE(Call(Request(prompt_), &response).ok());
  EXPECT_EQ(UsedBlocks(), 0);
}

// With the engine's ExportPlan, the service reserves each prompt's store space while the engine
// computes, and the upload is one Commit: the hashes it reserved (under the pruning engine's and
// the tenant's salts) are exactly the ones exported.
TEST_F(PrefillServiceTest, ReservesTheStoreSpaceWhileTheEngineComputes) {
  RestartPruning({}, /*reserve_ahead=*/true);

  for (int i = 0; i < 3; ++i) {
    tandem::v1::PrefillRequest request = Request(prompt_);
    request.set_cache_salt(100 + i);  // a tenant each: distinct blocks
    tandem::v1::PrefillResponse response;
    ASSERT_TRUE(Call(request, &response).ok());
    EXPECT_EQ(response.kv().block_hashes_size(), 4);
  }
  EXPECT_EQ(service_->uploads(), 3);
  EXPECT_EQ(service_->reserved_uploads(), 3);
  const cache_store::ShmHandoffStats shm = store_service_->shm().Stats();
  EXPECT_EQ(shm.reserved_blocks, 12);  // reserved once, ahead
  EXPECT_EQ(shm.committed_blocks, 12);
  EXPECT_EQ(block_store_->Stats().blocks, 12);
}

// POP's attention-stability monitor: a pruning engine, a sample rate, and the reports.
TEST_F(PrefillServiceTest, StabilityMonitorChecksTheSampledFraction) {
  absl::Mutex mu;
  std::vector<std::vector<model::LayerSimilarity>> reports;
  PrefillServiceOptions options;
  options.stability_sample_rate = 0.5;
  options.on_stability = [&](const std::vector<model::LayerSimilarity>& layers) {
    absl::MutexLock lock(&mu);
    reports.push_back(layers);
  };
  RestartPruning(options);

  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = prompt_;
    prompt[0] = i;  // distinct prompts
    tandem::v1::PrefillResponse response;
    ASSERT_TRUE(Call(Request(prompt), &response).ok());
  }
  // The checks run as loop tasks after the responses: wait for the loop to pass them.
  absl::Notification drained;
  loop_->Post([&](engine::Engine&) { drained.Notify(); });
  drained.WaitForNotification();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(reports.size(), 3u);  // requests 2, 4, 6
  const int layers = model_->config().num_layers;
  for (const auto& r : reports) {
    ASSERT_EQ(static_cast<int>(r.size()), layers - 1);  // layers 1.. are pruned
    EXPECT_NEAR(r[0].cosine, 1.0, 1e-6);                // the first sees what full prefill sees
    for (const auto& l : r) EXPECT_LE(l.cosine, 1.0 + 1e-9);
  }
}

}  // namespace
}  // namespace tandem::prefill
