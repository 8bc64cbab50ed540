// Prefill worker, cache-store shard and decode worker as real gRPC services on loopback: the
// disaggregated path streams exactly the tokens one engine produces; resident blocks are hits
// without a transfer, missing ones are misses that still decode correctly, and a cancelled
// stream frees everything.
#include "decode_worker/decode_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/synchronization/notification.h"
#include "cache_store/cache_store_service.h"
#include "prefill_worker/prefill_service.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/serving.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::decode {
namespace {

struct Stream {
  std::vector<int32_t> tokens;
  std::vector<int> chunk_sizes;  // tokens per message
  int hits = -1, misses = -1;
  int memory_hits = -1, disk_hits = -1;  // of hits, from the store's tiers
  tandem::v1::FinishReason finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
  grpc::Status status;
};

class DecodeServiceTest : public testing::TinyModelTest {
 protected:
  void SetUp() override {
    TinyModelTest::SetUp();
    for (int i = 0; i < 70; ++i) prompt_.push_back((i * 43 + 11) % 128);  // 4 full blocks + 6
    block_store_ = cache_store::BlockStore::Create({.capacity_bytes = 64 << 20}).value();
    store_service_ = std::make_unique<cache_store::CacheStoreService>(*block_store_, 4096);
    std::string store_address, prefill_address, decode_address;
    store_server_ = testing::ServeOnLoopback(store_service_.get(), &store_address);
    store_pool_ =
        std::make_unique<store::StorePool>(std::vector<std::string>{store_address}, "tiny");
    prefill_loop_ = std::make_unique<engine::EngineLoop>(MakeEngine());
    decode_loop_ = std::make_unique<engine::EngineLoop>(MakeEngine());
    prefill_ = std::make_unique<prefill::PrefillService>(*prefill_loop_, *store_pool_);
    decode_ = std::make_unique<DecodeService>(*decode_loop_, *store_pool_);
    prefill_server_ = testing::ServeOnLoopback(prefill_.get(), &prefill_address);
    decode_server_ = testing::ServeOnLoopback(decode_.get(), &decode_address);
    prefill_stub_ = tandem::v1::PrefillWorker::NewStub(
        grpc::CreateChannel(prefill_address, grpc::InsecureChannelCredentials()));
    decode_stub_ = tandem::v1::DecodeWorker::NewStub(
        grpc::CreateChannel(decode_address, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    decode_server_->Shutdown();
    prefill_server_->Shutdown();
    decode_loop_.reset();
    prefill_loop_.reset();
    decode_.reset();
    prefill_.reset();
    store_server_->Shutdown();
  }

  std::vector<int32_t> Expected(int max_tokens) {
    auto e = MakeEngine();
    return testing::RunToCompletion(*e, testing::GreedyRequest("w", prompt_, max_tokens)).tokens;
  }

  tandem::v1::PrefillResponse Prefill() {
    tandem::v1::PrefillRequest req;
    for (int32_t t : prompt_) req.add_token_ids(t);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    tandem::v1::PrefillResponse resp;
    EXPECT_TRUE(prefill_stub_->Prefill(&context, req, &resp).ok());
    return resp;
  }

  tandem::v1::DecodeRequest DecodeRequest(const tandem::v1::PrefillResponse& p, int max_tokens) {
    tandem::v1::DecodeRequest req;
    for (int32_t t : prompt_) req.add_token_ids(t);
    req.add_token_ids(p.first_token());
    req.set_completion_tokens(1);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    *req.mutable_kv() = p.kv();
    return req;
  }

  // Reads the whole stream; with `cancel_after` > 0, cancels after that many messages.
  Stream Decode(const tandem::v1::DecodeRequest& req, int cancel_after = 0) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = decode_stub_->Decode(&context, req);
    Stream s;
    tandem::v1::DecodeResponse msg;
    int messages = 0;
    while (reader->Read(&msg)) {
      if (messages++ == 0) {
        s.hits = msg.kv_hits();
        s.misses = msg.kv_misses();
        s.memory_hits = msg.kv_store_memory_hits();
        s.disk_hits = msg.kv_store_disk_hits();
      }
      s.tokens.insert(s.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
      s.chunk_sizes.push_back(msg.token_ids_size());
      if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED)
        s.finish = msg.finish_reason();
      if (messages == cancel_after) context.TryCancel();
    }
    s.status = reader->Finish();
    return s;
  }

  int64_t DecodeUsedBlocks() { return testing::UsedBlocks(*decode_loop_); }

  // Serves a decode service made with `options` (and `pool`, if given) in place of the default.
  void ReplaceDecodeService(const DecodeServiceOptions& options, store::StorePool* pool = nullptr) {
    decode_server_->Shutdown();
    decode_ = std::make_unique<DecodeService>(*decode_loop_, pool ? *pool : *store_pool_, options);
    std::string address;
    decode_server_ = testing::ServeOnLoopback(decode_.get(), &address);
    decode_stub_ = tandem::v1::DecodeWorker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  std::vector<int32_t> prompt_;
  std::unique_ptr<cache_store::BlockStore> block_store_;
  std::unique_ptr<cache_store::CacheStoreService> store_service_;
  std::unique_ptr<grpc::Server> store_server_;
  std::unique_ptr<store::StorePool> store_pool_;
  std::unique_ptr<engine::EngineLoop> prefill_loop_, decode_loop_;
  std::unique_ptr<prefill::PrefillService> prefill_;
  std::unique_ptr<DecodeService> decode_;
  std::unique_ptr<grpc::Server> prefill_server_, decode_server_;
  std::unique_ptr<tandem::v1::PrefillWorker::Stub> prefill_stub_;
  std::unique_ptr<tandem::v1::DecodeWorker::Stub> decode_stub_;
};

TEST_F(DecodeServiceTest, DisaggregatedStreamEqualsOneEngine) {
  const std::vector<int32_t> expected = Expected(10);
  const auto p = Prefill();
  ASSERT_EQ(p.first_token(), expected[0]);
  const Stream s = Decode(DecodeRequest(p, 10));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(s.finish, tandem::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(s.hits, 4);
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.memory_hits, 4);  // from the store's memory
  EXPECT_EQ(s.disk_hits, 0);
  const int64_t store_hits = block_store_->Stats().hits;
  EXPECT_EQ(store_hits, 4);

  // Again: the blocks are resident in the decode engine now, nothing is fetched.
  const Stream again = Decode(DecodeRequest(p, 10));
  EXPECT_EQ(again.tokens, s.tokens);
  EXPECT_EQ(again.hits, 4);
  EXPECT_EQ(again.memory_hits, 0);
  EXPECT_EQ(again.disk_hits, 0);
  EXPECT_EQ(block_store_->Stats().hits, store_hits);
  EXPECT_EQ(decode_->kv_hits(), 8);
  EXPECT_EQ(decode_->kv_worker_hits(), 4);
  EXPECT_EQ(decode_->kv_store_memory_hits(), 4);
  EXPECT_EQ(decode_->kv_store_disk_hits(), 0);
  EXPECT_EQ(DecodeUsedBlocks(), 0);
}

// A shard restarted on its disk tier's directory serves the prompt's blocks from disk: decode
// counts them as hits, and says which tier they came from.
TEST_F(DecodeServiceTest, BlocksReadBackFromTheStoresDiskAreHitsFromDisk) {
  for (bool shared_memory : {true, false}) {  // blocks copied through the arena, or streamed
    SCOPED_TRACE(shared_memory ? "shared memory" : "stream");
    prompt_[0] = shared_memory ? 5 : 6;  // a prompt of its own: none of its blocks resident
    const std::string disk_dir = testing::MakeTempDir("decode_disk");
    cache_store::BlockStoreOptions options;
    options.capacity_bytes = 64 << 20;
    options.shared_memory = shared_memory;
    options.disk.directory = disk_dir;
    options.disk.capacity_bytes = 4 << 20;
    options.disk.segment_bytes = 1 << 20;
    auto shard = [&] {
      auto store = cache_store::BlockStore::Create(options);
      EXPECT_TRUE(store.ok()) << store.status();
      return store.ok() ? *std::move(store) : nullptr;
    };
    std::unique_ptr<cache_store::BlockStore> disk_store = shard();
    ASSERT_NE(disk_store, nullptr);
    auto service = std::make_unique<cache_store::CacheStoreService>(*disk_store, 4096);
    std::string address;
    std::unique_ptr<grpc::Server> server = testing::ServeOnLoopback(service.get(), &address);
    // The prompt's blocks, as prefill exported them, put into the shard and spilled to disk.
    const auto p = Prefill();
    std::vector<uint64_t> hashes(p.kv().block_hashes().begin(), p.kv().block_hashes().end());
    const std::vector<std::optional<std::string>> got = store_pool_->Get(hashes);
    std::vector<store::BlockData> blocks;
    for (size_t i = 0; i < hashes.size(); ++i) {
      ASSERT_TRUE(got[i].has_value());
      blocks.push_back({hashes[i], *got[i]});
    }
    {
      store::StorePool pool({address}, "tiny");
      ASSERT_EQ(pool.Put(blocks).uploaded, 4);
    }
    ASSERT_TRUE(testing::Eventually([&] { return disk_store->Stats().spilled == 4; }));
    // The shard restarts on the same directory: the blocks are on its disk only.
    server->Shutdown();
    service.reset();
    disk_store.reset();
    disk_store = shard();
    ASSERT_NE(disk_store, nullptr);
    ASSERT_EQ(disk_store->Stats().blocks, 0);
    service = std::make_unique<cache_store::CacheStoreService>(*disk_store, 4096);
    server = testing::ServeOnLoopback(service.get(), &address);
    {
      store::StorePool restarted({address}, "tiny");
      ReplaceDecodeService({}, &restarted);
      const std::vector<int32_t> expected = Expected(8);
      const Stream s = Decode(DecodeRequest(p, 8));
      ReplaceDecodeService({});  // before `restarted` goes
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      EXPECT_EQ(s.tokens, std::vector<int32_t>(expected.begin() + 1, expected.end()));
      EXPECT_EQ(s.hits, 4);
      EXPECT_EQ(s.misses, 0);
      EXPECT_EQ(s.disk_hits, 4);
      EXPECT_EQ(s.memory_hits, 0);
      EXPECT_EQ(disk_store->Stats().promoted, 4);
    }
    server->Shutdown();
    std::filesystem::remove_all(disk_dir);
  }
}

// scheduler.stream_interval 4: the first token goes alone, then messages of 4, and the last
// with what is left; the tokens are the same. The engine-side timings see every token.
TEST_F(DecodeServiceTest, StreamIntervalGathersTokensPerMessage) {
  prometheus::Histogram ttft({1.0}), itl({1.0});
  ReplaceDecodeService(
      {.stream_interval = 4, .time_to_first_token = &ttft, .inter_token_latency = &itl});
  const std::vector<int32_t> expected = Expected(12);
  const auto p = Prefill();
  const Stream s = Decode(DecodeRequest(p, 12));  // 11 tokens from the decode worker
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(s.chunk_sizes, (std::vector<int>{1, 4, 4, 2}));
  EXPECT_EQ(s.hits, 4);  // with the first message, as always
  EXPECT_EQ(s.finish, tandem::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ttft.Collect().histogram.sample_count, 1u);
  EXPECT_EQ(itl.Collect().histogram.sample_count, 10u);  // 11 tokens, 10 gaps
  EXPECT_EQ(DecodeUsedBlocks(), 0);
}

TEST_F(DecodeServiceTest, MissingBlocksAreMissesAndStillCorrect) {
  const std::vector<int32_t> expected = Expected(6);
  auto p = Prefill();
  for (int i = 0; i < p.kv().block_hashes_size(); ++i) {
    p.mutable_kv()->set_block_hashes(i, p.kv().block_hashes(i) ^ 0xdead);  // nowhere to be found
  }
  const Stream s = Decode(DecodeRequest(p, 6));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.misses, 4);
  EXPECT_EQ(s.tokens, std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(decode_->kv_misses(), 4);
}

TEST_F(DecodeServiceTest, CancelFreesEverythingAndBadInputIsRefused) {
  const auto p = Prefill();
  const Stream s = Decode(DecodeRequest(p, 400), /*cancel_after=*/2);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(s.tokens.size(), 399u);
  // The abort reaches the engine within a step or two.
  EXPECT_TRUE(testing::Eventually([&] { return DecodeUsedBlocks() == 0; }));

  tandem::v1::DecodeRequest empty;
  empty.mutable_sampling()->set_max_tokens(4);
  EXPECT_EQ(Decode(empty).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto no_room = DecodeRequest(p, 1);  // 1 token already generated: nothing left to do
  EXPECT_EQ(Decode(no_room).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A fetch thread asks the engine loop which blocks are resident; a loop that does not answer
// (stuck, or busy far longer than a step) fails the request with UNAVAILABLE, which the router
// retries elsewhere, instead of holding the fetch thread and the stream forever.
TEST_F(DecodeServiceTest, AnEngineLoopThatDoesNotAnswerFailsTheRequest) {
  const auto p = Prefill();
  ReplaceDecodeService({.engine_timeout = std::chrono::milliseconds(200)});
  absl::Notification release;
  decode_loop_->Post([&](engine::Engine&) { release.WaitForNotification(); });
  const Stream stuck = Decode(DecodeRequest(p, 4));
  EXPECT_EQ(stuck.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(stuck.status.error_message().find("did not answer"), std::string::npos)
      << stuck.status.error_message();
  release.Notify();
  const Stream s = Decode(DecodeRequest(p, 4));  // the loop answers again
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens.size(), 3u);
  EXPECT_TRUE(testing::Eventually([&] { return DecodeUsedBlocks() == 0; }));
}

}  // namespace
}  // namespace tandem::decode
