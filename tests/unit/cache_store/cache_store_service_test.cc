// The cache-store shard as a real gRPC server on a loopback port, driven by CacheStoreClient
// and by a raw stub for streams the client would never send.
#include "cache_store/cache_store_service.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/store/cache_store_client.h"
#include "tests/unit/testing/eventually.h"

namespace tandem::cache_store {
namespace {

using store::BlockData;
using store::CacheStoreClient;
using store::CacheStoreClientOptions;
using ::testing::HasSubstr;

std::string Bytes(uint64_t seed, size_t n) {
  std::string v(n, '\0');
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 17 + i * 31 + (i >> 8));
  return v;
}

class CacheStoreServiceTest : public ::testing::Test {
 protected:
  void Start(int64_t capacity, int64_t chunk_bytes = 1000, bool shared_memory = true,
             std::chrono::milliseconds lease_ttl = std::chrono::seconds(30)) {
    store_ =
        BlockStore::Create({.capacity_bytes = capacity, .shared_memory = shared_memory}).value();
    service_ = std::make_unique<CacheStoreService>(*store_, chunk_bytes,
                                                   ShmHandoffOptions{.leases = {.ttl = lease_ttl}});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    port_ = port;
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    client_ = std::make_unique<CacheStoreClient>(channel_, "model", 700);
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Sends raw messages on a Put stream and returns the final status.
  grpc::Status RawPut(const std::vector<tandem::v1::PutRequest>& msgs) {
    auto stub = tandem::v1::CacheStore::NewStub(channel_);
    grpc::ClientContext context;
    tandem::v1::PutResponse response;
    auto writer = stub->Put(&context, &response);
    for (const auto& m : msgs) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  int port_ = 0;
  std::unique_ptr<CacheStoreClient> client_;
};

TEST_F(CacheStoreServiceTest, PutGetExistsAndStatsRoundTrip) {
  Start(1 << 20);
  std::vector<BlockData> blocks = {{11, Bytes(1, 2500)}, {12, Bytes(2, 700)}, {13, Bytes(3, 1)}};
  auto put = client_->Put(blocks);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->stored, 3);
  EXPECT_EQ(put->skipped, 0);
  auto again = client_->Put(blocks);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored, 0);
  EXPECT_EQ(again->skipped, 3);

  const std::vector<uint64_t> hashes = {13, 99, 11, 12};
  auto got = client_->Get(hashes);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 4u);
  EXPECT_EQ((*got)[0], blocks[2].bytes);
  EXPECT_FALSE((*got)[1].has_value());
  EXPECT_EQ((*got)[2], blocks[0].bytes);
  EXPECT_EQ((*got)[3], blocks[1].bytes);

  auto exists = client_->Exists(hashes);
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(*exists, (std::vector<bool>{true, false, true, true}));
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->blocks(), 3);
  EXPECT_EQ(stats->used_bytes(), 2500 + 700 + 1);
  EXPECT_EQ(stats->hits(), 3);
  EXPECT_EQ(stats->misses(), 1);
  EXPECT_EQ(stats->pinned_blocks(), 0);  // every pin released after streaming
}

TEST_F(CacheStoreServiceTest, MalformedStreamsAreRefusedAndLeaveNothingBehind) {
  Start(1 << 20);
  tandem::v1::PutRequest header;
  header.set_block_hash(5);
  header.set_block_bytes(100);
  const std::string five = Bytes(5, 100);
  header.set_checksum(store::BlockChecksum({reinterpret_cast<const uint8_t*>(five.data()), 100}));
  header.set_data(std::string(40, 'x'));
  tandem::v1::PutRequest orphan;
  orphan.set_block_hash(6);
  orphan.set_data("abc");

  grpc::Status s = RawPut({orphan});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("without its header"));

  s = RawPut({header});  // ends 60 bytes short
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("inside block 5"));

  tandem::v1::PutRequest other = header;
  other.set_block_hash(7);
  s = RawPut({header, other});  // a new block before the first was complete
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  tandem::v1::PutRequest whole = header;
  whole.set_data(std::string(100, 'x'));  // bytes that do not match the checksum
  s = RawPut({whole});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);

  whole.set_block_bytes(int64_t{1} << 40);
  s = RawPut({whole});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const BlockStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.blocks, 0);
  EXPECT_EQ(stats.pending_puts, 0);
  EXPECT_EQ(stats.used_bytes, 0);
  EXPECT_FALSE(store_->Exists(5));
}

TEST_F(CacheStoreServiceTest, FullStoreIsResourceExhausted) {
  Start(1 << 20);
  ASSERT_TRUE(client_->Put({{BlockData{1, Bytes(1, 600 * 1024)}}}).ok());
  auto pinned = store_->Get(1);  // a transfer in flight pins the block
  ASSERT_TRUE(pinned.ok());
  auto put = client_->Put({{BlockData{2, Bytes(2, 600 * 1024)}}});
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted);
  pinned->Reset();
  EXPECT_TRUE(client_->Put({{BlockData{2, Bytes(2, 600 * 1024)}}}).ok());  // evicts 1
  EXPECT_FALSE(store_->Exists(1));
  EXPECT_FALSE(client_->Put({{BlockData{3, {}}}}).ok());  // empty blocks never leave the client
}

// Blocks written through shared memory read back identically over the stream, and the other
// way round; the shared-memory client used its path for every block.
TEST_F(CacheStoreServiceTest, SharedMemoryAndStreamCarryTheSameBytes) {
  Start(8 << 20);
  CacheStoreClient shm(channel_, "model", CacheStoreClientOptions{.shared_memory = true});
  const std::vector<BlockData> by_shm = {
      {21, Bytes(21, 64 << 10)}, {22, Bytes(22, 5000)}, {23, Bytes(23, 1)}};
  const std::vector<BlockData> by_stream = {{31, Bytes(31, 64 << 10)}, {32, Bytes(32, 3)}};
  auto put = shm.Put(by_shm);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->stored, 3);
  EXPECT_TRUE(shm.shared_memory_attached());
  EXPECT_EQ(service_->shm().Stats().committed_blocks, 3);
  ASSERT_TRUE(client_->Put(by_stream).ok());

  const std::vector<uint64_t> hashes = {21, 31, 99, 22, 32, 23};
  auto streamed = client_->Get(hashes);
  auto mapped = shm.Get(hashes);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(*streamed, *mapped);
  EXPECT_EQ((*mapped)[0], by_shm[0].bytes);
  EXPECT_EQ((*mapped)[1], by_stream[0].bytes);
  EXPECT_FALSE((*mapped)[2].has_value());
  EXPECT_EQ((*mapped)[5], by_shm[2].bytes);
  EXPECT_EQ(service_->shm().Stats().acquired_blocks, 5);

  auto again = shm.Put(by_shm);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->skipped, 3);
  // The get's lease is released without waiting for the answer, and its pins after the lease
  // leaves the table (outside the table's lock), so both are waited for.
  EXPECT_TRUE(testing::Eventually([&] {
    return service_->shm().Stats().open_leases == 0 && store_->Stats().pinned_blocks == 0;
  }));
  EXPECT_EQ(store_->Stats().pending_puts, 0);
}

// A worker starting attaches before its first transfer (CacheStoreClient::Connect); a shard
// that is not up yet costs the first transfer nothing more than attaching then, not a pause of
// streaming.
TEST_F(CacheStoreServiceTest, ConnectAttachesAheadAndAShardNotUpYetIsNotHeldAgainstIt) {
  Start(8 << 20);
  CacheStoreClient early(channel_, "model", CacheStoreClientOptions{.shared_memory = true});
  early.Connect();
  EXPECT_TRUE(early.shared_memory_attached());
  ASSERT_TRUE(early.Put({{BlockData{1, Bytes(1, 3000)}}}).ok());
  EXPECT_EQ(service_->shm().Stats().committed_blocks, 1);

  // The shard goes away and comes back at the same address; a client started meanwhile.
  const std::string address = absl::StrCat("127.0.0.1:", port_);
  server_->Shutdown();
  server_.reset();
  grpc::ChannelArguments fast_reconnect;
  fast_reconnect.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 10);
  fast_reconnect.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10);
  fast_reconnect.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  auto channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), fast_reconnect);
  CacheStoreClient late(channel, "model", CacheStoreClientOptions{.shared_memory = true});
  late.Connect();
  EXPECT_FALSE(late.shared_memory_attached());
  service_ = std::make_unique<CacheStoreService>(*store_, 1000, ShmHandoffOptions{});
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  ASSERT_NE(server_, nullptr);
  ASSERT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
  ASSERT_TRUE(late.Put({{BlockData{2, Bytes(2, 3000)}}}).ok());
  EXPECT_TRUE(late.shared_memory_attached());  // not streamed for a pause after the failed try
  EXPECT_EQ(service_->shm().Stats().committed_blocks, 1);
}

TEST_F(CacheStoreServiceTest, WithoutSharedMemoryTheClientStreams) {
  Start(1 << 20, 1000, /*shared_memory=*/false);
  CacheStoreClient shm(channel_, "model", CacheStoreClientOptions{.shared_memory = true});
  ASSERT_TRUE(shm.Put({{BlockData{1, Bytes(1, 3000)}}}).ok());
  auto got = shm.Get({{1}});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], Bytes(1, 3000));
  EXPECT_FALSE(shm.shared_memory_attached());
  EXPECT_EQ(service_->shm().Stats().committed_blocks, 0);
}

// A client that reserves and pins through raw calls and then vanishes (its calls ended, its
// leases never committed or released) leaves nothing held once its leases expire.
TEST_F(CacheStoreServiceTest, AVanishedSharedMemoryClientLeaksNothing) {
  Start(1 << 20, 1000, true, std::chrono::milliseconds(100));
  ASSERT_TRUE(client_->Put({{BlockData{1, Bytes(1, 4000)}}}).ok());
  {
    auto stub = tandem::v1::CacheStore::NewStub(channel_);
    grpc::ClientContext attach_context;
    tandem::v1::AttachSharedMemoryResponse attach;
    ASSERT_TRUE(stub->AttachSharedMemory(&attach_context, {}, &attach).ok());
    EXPECT_EQ(attach.lease_ms(), 100);
    grpc::ClientContext reserve_context;
    tandem::v1::ReserveShmRequest reserve;
    reserve.set_instance_id(attach.instance_id());
    auto* block = reserve.add_blocks();
    block->set_block_hash(2);
    block->set_block_bytes(300 << 10);
    tandem::v1::ReserveShmResponse reserved;
    ASSERT_TRUE(stub->ReserveShm(&reserve_context, reserve, &reserved).ok());
    grpc::ClientContext acquire_context;
    tandem::v1::AcquireShmRequest acquire;
    acquire.set_instance_id(attach.instance_id());
    acquire.add_block_hashes(1);
    tandem::v1::AcquireShmResponse acquired;
    ASSERT_TRUE(stub->AcquireShm(&acquire_context, acquire, &acquired).ok());
    ASSERT_TRUE(acquired.blocks(0).found());
  }  // the client is gone
  EXPECT_EQ(store_->Stats().pinned_blocks, 1);
  EXPECT_EQ(store_->Stats().pending_puts, 1);
  // An expired lease leaves the table first and ends (unpins) after the table's lock is dropped.
  EXPECT_TRUE(testing::Eventually([&] {
    return service_->shm().Stats().open_leases == 0 && store_->Stats().pinned_blocks == 0 &&
           store_->Stats().pending_puts == 0;
  }));
  const BlockStoreStats s = store_->Stats();
  EXPECT_EQ(s.pinned_blocks, 0);
  EXPECT_EQ(s.pending_puts, 0);
  EXPECT_EQ(s.used_bytes, 4000);
  EXPECT_EQ(service_->shm().Stats().expired_leases, 2);
}

}  // namespace
}  // namespace tandem::cache_store
