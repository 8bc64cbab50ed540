// The client's shared-memory path against a shard that lies: it offers a real arena, then hands
// out regions outside it, out of order or with wrong checksums. The client must refuse them
// before touching a byte, end the lease, and never crash.
#include "common/store/arena_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "absl/synchronization/mutex.h"
#include "cache_store/shm_arena.h"
#include "common/store/block_checksum.h"
#include "common/store/cache_store_client.h"
#include "tests/unit/testing/serving.h"

namespace tandem::store {
namespace {

class LyingShard final : public tandem::v1::CacheStore::CallbackService {
 public:
  explicit LyingShard(const cache_store::ShmArena& arena) : arena_(arena) {}

  void Answer(tandem::v1::AcquireShmResponse acquire, tandem::v1::ReserveShmResponse reserve) {
    absl::MutexLock lock(&mu_);
    acquire_ = std::move(acquire);
    reserve_ = std::move(reserve);
  }
  // Releases are not waited for by the client: waits (up to 10 s) until `n` have arrived.
  int WaitForReleases(int n) const {
    struct Wanted {
      const int* releases;
      int n;
    } wanted{&releases_, n};
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Wanted* w) { return *w->releases >= w->n; }, &wanted),
                         absl::Seconds(10));
    return releases_;
  }

  grpc::ServerUnaryReactor* AttachSharedMemory(
      grpc::CallbackServerContext* context, const tandem::v1::AttachSharedMemoryRequest*,
      tandem::v1::AttachSharedMemoryResponse* response) override {
    response->set_path(arena_.path());
    response->set_file_bytes(arena_.file_bytes());
    response->set_instance_id(arena_.instance_id());
    response->set_lease_ms(30000);
    return Ok(context);
  }
  // Offers a fabric that speaks `fabric_protocol_` (another release's), at no real worker.
  grpc::ServerUnaryReactor* AttachFabric(grpc::CallbackServerContext* context,
                                         const tandem::v1::AttachFabricRequest*,
                                         tandem::v1::AttachFabricResponse* response) override {
    response->set_worker_address("not a UCX worker's address");
    response->set_instance_id(arena_.instance_id());
    response->set_lease_ms(30000);
    response->set_arena_bytes(arena_.file_bytes());
    response->set_protocol(0x544b5601);  // "TKV", 1
    absl::MutexLock lock(&mu_);
    ++fabric_attaches_;
    return Ok(context);
  }
  int fabric_attaches() const {
    absl::MutexLock lock(&mu_);
    return fabric_attaches_;
  }
  grpc::ServerUnaryReactor* AcquireShm(grpc::CallbackServerContext* context,
                                       const tandem::v1::AcquireShmRequest*,
                                       tandem::v1::AcquireShmResponse* response) override {
    absl::MutexLock lock(&mu_);
    *response = acquire_;
    return Ok(context);
  }
  grpc::ServerUnaryReactor* ReserveShm(grpc::CallbackServerContext* context,
                                       const tandem::v1::ReserveShmRequest*,
                                       tandem::v1::ReserveShmResponse* response) override {
    absl::MutexLock lock(&mu_);
    *response = reserve_;
    return Ok(context);
  }
  grpc::ServerUnaryReactor* CommitShm(grpc::CallbackServerContext* context,
                                      const tandem::v1::CommitShmRequest* request,
                                      tandem::v1::CommitShmResponse* response) override {
    response->set_stored(request->checksums_size());
    return Ok(context);
  }
  grpc::ServerUnaryReactor* ReleaseShm(grpc::CallbackServerContext* context,
                                       const tandem::v1::ReleaseShmRequest*,
                                       tandem::v1::ReleaseShmResponse*) override {
    absl::MutexLock lock(&mu_);
    ++releases_;
    return Ok(context);
  }

 private:
  static grpc::ServerUnaryReactor* Ok(grpc::CallbackServerContext* context) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  const cache_store::ShmArena& arena_;
  mutable absl::Mutex mu_;
  tandem::v1::AcquireShmResponse acquire_ ABSL_GUARDED_BY(mu_);
  tandem::v1::ReserveShmResponse reserve_ ABSL_GUARDED_BY(mu_);
  int releases_ ABSL_GUARDED_BY(mu_) = 0;
  int fabric_attaches_ ABSL_GUARDED_BY(mu_) = 0;
};

class ShmClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_ = cache_store::ShmArena::Create(1 << 20).value();
    shard_ = std::make_unique<LyingShard>(*arena_);
    server_ = testing::ServeOnLoopback(shard_.get(), &address_);
    client_ = std::make_unique<CacheStoreClient>(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()), "model",
        CacheStoreClientOptions{.shared_memory = true});
    std::memcpy(arena_->data(), kBlock, sizeof(kBlock));  // file offset kShmHeaderBytes
  }
  void TearDown() override { server_->Shutdown(); }

  static tandem::v1::AcquireShmResponse Region(uint64_t hash, int64_t offset, int64_t size,
                                               uint64_t checksum, uint64_t lease = 77) {
    tandem::v1::AcquireShmResponse r;
    r.set_lease_id(lease);
    auto* b = r.add_blocks();
    b->set_block_hash(hash);
    b->set_found(true);
    b->set_offset(offset);
    b->set_block_bytes(size);
    b->set_checksum(checksum);
    return r;
  }
  uint64_t Good() const {
    return BlockChecksum64({reinterpret_cast<const uint8_t*>(kBlock), kBlockBytes});
  }

  static constexpr char kBlock[] = "a block of KV cache";
  static constexpr int64_t kBlockBytes = sizeof(kBlock);
  std::unique_ptr<cache_store::ShmArena> arena_;
  std::unique_ptr<LyingShard> shard_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<CacheStoreClient> client_;
};

TEST_F(ShmClientTest, AnHonestAnswerIsCopiedOut) {
  shard_->Answer(Region(1, kShmHeaderBytes, kBlockBytes, Good()), {});
  auto got = client_->Get({{1}});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], std::string(kBlock, kBlockBytes));
  EXPECT_TRUE(client_->shared_memory_attached());
  EXPECT_EQ(shard_->WaitForReleases(1), 1);
}

TEST_F(ShmClientTest, LyingRegionsAreRefused) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t end = arena_->file_bytes();
  tandem::v1::AcquireShmResponse wrong_hash = Region(2, kShmHeaderBytes, kBlockBytes, Good());
  tandem::v1::AcquireShmResponse no_lease = Region(1, kShmHeaderBytes, kBlockBytes, Good(), 0);
  tandem::v1::AcquireShmResponse two = Region(1, kShmHeaderBytes, kBlockBytes, Good());
  *two.add_blocks() = two.blocks(0);
  const std::vector<tandem::v1::AcquireShmResponse> lies = {
      Region(1, end, 64, Good()),       // past the end
      Region(1, end - 10, 64, Good()),  // runs past the end
      Region(1, -4096, 64, Good()),     // before the start
      Region(1, 0, 64, Good()),         // the header
      Region(1, kShmHeaderBytes, kMax, Good()),
      Region(1, kMax - 8, 64, Good()),  // offset + size overflows
      Region(1, kShmHeaderBytes, 0, Good()),
      Region(1, kShmHeaderBytes, -1, Good()),
      wrong_hash,
      no_lease,
      two,  // more blocks than asked for
  };
  int released = 0;
  for (size_t i = 0; i < lies.size(); ++i) {
    shard_->Answer(lies[i], {});
    auto got = client_->Get({{1}});
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << i;
    if (lies[i].lease_id() != 0) ++released;
    EXPECT_EQ(shard_->WaitForReleases(released), released) << i;  // the lease it was given is ended
  }
}

TEST_F(ShmClientTest, BytesThatDoNotMatchTheirChecksumAreDataLoss) {
  shard_->Answer(Region(1, kShmHeaderBytes, kBlockBytes, Good() + 1), {});
  EXPECT_EQ(client_->Get({{1}}).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(shard_->WaitForReleases(1), 1);
}

TEST_F(ShmClientTest, LyingReservationsAreRefusedBeforeWriting) {
  const std::string header_before(reinterpret_cast<const char*>(arena_->data()) - kShmHeaderBytes,
                                  kShmHeaderBytes);
  for (int64_t offset : {int64_t{0}, int64_t{-64}, arena_->file_bytes() - 8}) {
    tandem::v1::ReserveShmResponse r;
    r.set_lease_id(5);
    auto* res = r.add_reservations();
    res->set_block_hash(9);
    res->set_reserved(true);
    res->set_offset(offset);
    shard_->Answer({}, r);
    auto put = client_->Put({{BlockData{9, std::string(64, 'x')}}});
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInternal) << offset;
  }
  EXPECT_EQ(shard_->WaitForReleases(3), 3);
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(arena_->data()) - kShmHeaderBytes, kShmHeaderBytes),
      header_before);

  tandem::v1::ReserveShmResponse honest;  // and an honest one goes through
  honest.set_lease_id(6);
  auto* res = honest.add_reservations();
  res->set_block_hash(9);
  res->set_reserved(true);
  res->set_offset(kShmHeaderBytes + 4096);
  shard_->Answer({}, honest);
  auto put = client_->Put({{BlockData{9, std::string(64, 'x')}}});
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->stored, 1);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(arena_->data()) + 4096, 64),
            std::string(64, 'x'));
}

// A shard whose fabric speaks another protocol (a rolling upgrade) is not used over the fabric,
// so no transfer waits for a deadline on messages the other side drops: the client never
// touches UCX and takes the stream (which this shard does not serve: an error at once).
TEST_F(ShmClientTest, AFabricOfAnotherProtocolIsNotUsed) {
  CacheStoreClient client(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()),
                          "model", CacheStoreClientOptions{.fabric = true});
  const auto start = std::chrono::steady_clock::now();
  auto put = client.Put({{BlockData{9, std::string(64, 'x')}}});
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnimplemented) << put.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(shard_->fabric_attaches(), 1);
  EXPECT_FALSE(client.fabric_attached());
}

}  // namespace
}  // namespace tandem::store
