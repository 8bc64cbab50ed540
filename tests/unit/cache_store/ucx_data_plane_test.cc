// The KV fabric over real UCX on loopback: a shard with its data plane on a loopback gRPC port,
// clients that move blocks over UCX, and a raw UcxKvClient for what an honest client never
// sends (forged keys, ended leases, other regions). Each test runs on the transports UCX_TLS
// names, set per test from the parameter before either worker starts: tcp and sm (shared memory).
#include "cache_store/ucx_data_plane.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cache_store/cache_store_service.h"
#include "common/fabric/kv_protocol.h"
#include "common/fabric/ucx_worker.h"
#include "common/store/cache_store_client.h"
#include "common/store/ucx_client.h"
#include "tests/unit/testing/eventually.h"

namespace tandem::cache_store {
namespace {

using store::BlockData;
using store::CacheStoreClient;
using store::CacheStoreClientOptions;
using store::LeaseGrant;
using store::UcxKvClient;

std::string Bytes(uint64_t seed, size_t n) {
  std::string v(n, '\0');
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed * 29 + i * 13 + (i >> 9));
  return v;
}

std::span<const uint8_t> Span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class UcxDataPlaneTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", GetParam(), 1);
    Start(std::chrono::seconds(30));
  }
  void Start(std::chrono::milliseconds lease_ttl) {
    store_ = BlockStore::Create({.capacity_bytes = 16 << 20, .shared_memory = true}).value();
    service_ = std::make_unique<CacheStoreService>(*store_, 1 << 16,
                                                   ShmHandoffOptions{.leases = {.ttl = lease_ttl}});
    ASSERT_TRUE(service_->EnableFabric().ok());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = tandem::v1::CacheStore::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<CacheStoreClient> Client(bool fabric) {
    return std::make_unique<CacheStoreClient>(
        channel_, "model", CacheStoreClientOptions{.chunk_bytes = 1 << 16, .fabric = fabric});
  }

  tandem::v1::AttachFabricResponse Attach() {
    grpc::ClientContext context;
    tandem::v1::AttachFabricResponse attached;
    EXPECT_TRUE(stub_->AttachFabric(&context, {}, &attached).ok());
    return attached;
  }
  // Reserves one block of `n` bytes with a key.
  tandem::v1::ReserveShmResponse Reserve(uint64_t instance, uint64_t hash, int64_t n) {
    tandem::v1::ReserveShmRequest request;
    request.set_instance_id(instance);
    request.set_model_id("model");
    request.set_fabric(true);
    auto* block = request.add_blocks();
    block->set_block_hash(hash);
    block->set_block_bytes(n);
    grpc::ClientContext context;
    tandem::v1::ReserveShmResponse reserved;
    EXPECT_TRUE(stub_->ReserveShm(&context, request, &reserved).ok());
    return reserved;
  }
  // Pins block `hash` under a read lease with a key.
  tandem::v1::AcquireShmResponse Acquire(uint64_t instance, uint64_t hash) {
    tandem::v1::AcquireShmRequest request;
    request.set_instance_id(instance);
    request.set_model_id("model");
    request.set_fabric(true);
    request.add_block_hashes(hash);
    grpc::ClientContext context;
    tandem::v1::AcquireShmResponse acquired;
    EXPECT_TRUE(stub_->AcquireShm(&context, request, &acquired).ok());
    return acquired;
  }
  // A request for one block, as an honest client builds it (common/fabric/kv_protocol.h).
  static std::string OneBlockHeader(const LeaseGrant& lease, uint64_t request_id, int64_t offset,
                                    int64_t length) {
    const fabric::KvRequestHeader h{.count = 1,
                                    .request_id = request_id,
                                    .lease_id = lease.id,
                                    .key = {lease.key[0], lease.key[1]}};
    const fabric::KvBlockRef ref{.index = 0, .offset = offset, .length = length};
    std::string header(fabric::KvHeaderBytes(1), '\0');
    std::memcpy(header.data(), &h, sizeof h);
    std::memcpy(header.data() + sizeof h, &ref, sizeof ref);
    return header;
  }
  // On `worker`'s thread: sends active message `id` to `address`, asking for a reply. Returns
  // UCX's request, still in progress, or null.
  static ucs_status_ptr_t SendWithReply(fabric::UcxWorker& worker, const std::string& address,
                                        unsigned id, const std::string& header,
                                        std::string_view bytes = {}) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t request = ucp_am_send_nbx(worker.Endpoint(address).value(), id, header.data(),
                                               header.size(), bytes.data(), bytes.size(), &param);
    return UCS_PTR_IS_ERR(request) ? nullptr : request;
  }
  template <typename Response>
  static LeaseGrant Grant(const Response& r) {
    LeaseGrant g{.id = r.lease_id()};
    EXPECT_EQ(r.fabric_key().size(), sizeof g.key);
    std::memcpy(g.key.data(), r.fabric_key().data(), sizeof g.key);
    return g;
  }
  // The arena's bytes at a file offset.
  std::string ArenaBytes(int64_t offset, int64_t n) const {
    const ShmArena* arena = store_->arena();
    return std::string(reinterpret_cast<const char*>(arena->data()) + offset -
                           (arena->file_bytes() - arena->data_bytes()),
                       n);
  }

  static constexpr auto kDeadline = std::chrono::seconds(10);
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<CacheStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::CacheStore::Stub> stub_;
};

// Blocks of every size class (eager and rendezvous) put over the fabric read back identically
// over the stream, and the other way round; the bytes went through the data plane.
TEST_P(UcxDataPlaneTest, PutAndGetAreByteIdenticalToTheStream) {
  auto fabric = Client(true);
  auto stream = Client(false);
  const std::vector<BlockData> by_fabric = {{1, Bytes(1, 1)},
                                            {2, Bytes(2, 5000)},
                                            {3, Bytes(3, 64 << 10)},
                                            {4, Bytes(4, 1 << 20)},
                                            {5, Bytes(5, (3 << 20) + 17)}};
  const std::vector<BlockData> by_stream = {{11, Bytes(11, 300)}, {12, Bytes(12, 2 << 20)}};
  auto put = fabric->Put(by_fabric);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->stored, 5);
  EXPECT_TRUE(fabric->fabric_attached());
  ASSERT_TRUE(stream->Put(by_stream).ok());

  const std::vector<uint64_t> hashes = {1, 11, 99, 2, 3, 12, 4, 5};
  auto streamed = stream->Get(hashes);
  auto fabricated = fabric->Get(hashes);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  ASSERT_TRUE(fabricated.ok()) << fabricated.status();
  EXPECT_EQ(*streamed, *fabricated);
  EXPECT_EQ((*fabricated)[0], by_fabric[0].bytes);
  EXPECT_EQ((*fabricated)[1], by_stream[0].bytes);
  EXPECT_FALSE((*fabricated)[2].has_value());
  EXPECT_EQ((*fabricated)[7], by_fabric[4].bytes);

  // A get is counted when the shard's send completes, which may be after the bytes arrived.
  EXPECT_TRUE(testing::Eventually([&] { return service_->fabric()->Stats().get.blocks == 7; }));
  const UcxDataPlaneStats s = service_->fabric()->Stats();
  EXPECT_EQ(s.put.blocks, 5);
  EXPECT_EQ(s.get.bytes, 1 + 300 + 5000 + (64 << 10) + (2 << 20) + (1 << 20) + (3 << 20) + 17);
  EXPECT_EQ(s.put.refused + s.get.refused, 0);
  auto again = fabric->Put(by_fabric);  // all held: nothing moves
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->skipped, 5);
  EXPECT_EQ(service_->fabric()->Stats().put.blocks, 5);
  EXPECT_TRUE(testing::Eventually([&] {
    return service_->shm().Stats().open_leases == 0 && store_->Stats().pinned_blocks == 0;
  }));
}

// Small blocks share messages, up to the header's limit of blocks per message and the
// client's message size; a block of the message size moves alone. Both directions, byte-exact.
TEST_P(UcxDataPlaneTest, SmallBlocksShareMessagesAndLargeOnesMoveAlone) {
  auto fabric = Client(true);
  std::vector<BlockData> small;
  std::vector<uint64_t> hashes;
  for (uint64_t h = 100; h < 230; ++h) {  // 130 blocks of 3-4 KiB, odd sizes: 460 KiB
    small.push_back({h, Bytes(h, 3000 + h * 7)});
    hashes.push_back(h);
  }
  auto put = fabric->Put(small);
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_EQ(put->stored, 130);
  const size_t per_message = UcxKvClient::Shared().value()->blocks_per_message();
  ASSERT_GE(per_message, 64u);  // the transports carry headers of 1.5 KiB and more
  ASSERT_LE(per_message, fabric::kKvMaxBlocksPerMessage);
  const int64_t messages = static_cast<int64_t>((130 + per_message - 1) / per_message);
  EXPECT_EQ(service_->fabric()->Stats().put.messages, messages);
  EXPECT_EQ(service_->fabric()->Stats().put.blocks, 130);
  auto got = fabric->Get(hashes);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < small.size(); ++i) ASSERT_EQ((*got)[i], small[i].bytes) << i;
  EXPECT_TRUE(testing::Eventually([&] {
    return service_->fabric()->Stats().get.messages == messages &&
           service_->fabric()->Stats().get.blocks == 130;
  }));

  const int64_t alone = UcxKvClient::kMessageBytes;
  const std::vector<BlockData> large = {{300, Bytes(300, alone)}, {301, Bytes(301, alone)}};
  ASSERT_TRUE(fabric->Put(large).ok());
  EXPECT_EQ(service_->fabric()->Stats().put.messages, messages + 2);
  auto got_large = fabric->Get(std::vector<uint64_t>{300, 301});
  ASSERT_TRUE(got_large.ok());
  EXPECT_EQ((*got_large)[0], large[0].bytes);
  EXPECT_EQ((*got_large)[1], large[1].bytes);
  EXPECT_EQ(service_->fabric()->Stats().get.refused, 0);
}

// A message is checked as a whole: one wrong region among several refuses all of them, and none
// of the blocks changes.
TEST_P(UcxDataPlaneTest, AMessageIsRefusedAsAWhole) {
  const tandem::v1::AttachFabricResponse attached = Attach();
  tandem::v1::ReserveShmRequest request;
  request.set_instance_id(attached.instance_id());
  request.set_model_id("model");
  request.set_fabric(true);
  for (uint64_t h : {41, 42, 43}) {
    auto* block = request.add_blocks();
    block->set_block_hash(h);
    block->set_block_bytes(9000);
  }
  grpc::ClientContext context;
  tandem::v1::ReserveShmResponse reserved;
  ASSERT_TRUE(stub_->ReserveShm(&context, request, &reserved).ok());
  const LeaseGrant lease = Grant(reserved);
  const std::string bytes[3] = {Bytes(41, 9000), Bytes(42, 9000), Bytes(43, 9000)};
  std::vector<store::ArenaRegion> regions;
  std::vector<std::string> before;
  for (uint32_t i = 0; i < 3; ++i) {
    const int64_t offset = reserved.reservations(static_cast<int>(i)).offset();
    regions.push_back({.index = i, .offset = offset, .length = 9000, .bytes = Span(bytes[i])});
    before.push_back(ArenaBytes(offset, 9000));
  }
  auto ucx = UcxKvClient::Shared().value();
  const auto deadline = [] { return UcxKvClient::Clock::now() + kDeadline; };
  std::vector<store::ArenaRegion> wrong = regions;
  wrong[2].offset = regions[0].offset;  // another block's region
  EXPECT_EQ(ucx->Write(attached.worker_address(), lease, wrong, deadline()).code(),
            absl::StatusCode::kInvalidArgument);
  wrong = regions;
  wrong[1].index = 7;  // no such block in the lease
  EXPECT_EQ(ucx->Write(attached.worker_address(), lease, wrong, deadline()).code(),
            absl::StatusCode::kInvalidArgument);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ArenaBytes(regions[i].offset, 9000), before[i]) << i;
  EXPECT_EQ(service_->fabric()->Stats().put.refused, 2);
  ASSERT_TRUE(ucx->Write(attached.worker_address(), lease, regions, deadline()).ok());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ArenaBytes(regions[i].offset, 9000), bytes[i]) << i;
  EXPECT_EQ(service_->fabric()->Stats().put.messages, 1);
}

// A reservation made ahead (before the bytes exist) is filled over the fabric in one round trip.
TEST_P(UcxDataPlaneTest, AReservationMadeAheadIsFilledOverTheFabric) {
  auto fabric = Client(true);
  const std::vector<BlockData> blocks = {{7, Bytes(7, 40000)}, {8, Bytes(8, 200000)}};
  std::vector<store::BlockSize> sizes;
  for (const BlockData& b : blocks) sizes.push_back({b.hash, static_cast<int64_t>(b.bytes.size())});
  auto reservation = fabric->Reserve(sizes);
  ASSERT_NE(reservation, nullptr);
  auto put = fabric->Put(blocks, reservation.get());
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(put->ahead);
  EXPECT_EQ(put->stored, 2);
  auto got = Client(false)->Get(std::vector<uint64_t>{7, 8});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[1], blocks[1].bytes);
}

// The shard checks every message: a forged key, a region that is not the block's, a lease of
// the other kind or one that ended are refused, and no byte of the arena changes.
TEST_P(UcxDataPlaneTest, AForgedOrEndedKeyIsRefusedAndNothingMoves) {
  const tandem::v1::AttachFabricResponse attached = Attach();
  auto ucx = UcxKvClient::Shared().value();
  const std::string block = Bytes(9, 100000);
  const tandem::v1::ReserveShmResponse reserved = Reserve(attached.instance_id(), 9, 100000);
  ASSERT_TRUE(reserved.reservations(0).reserved());
  const int64_t offset = reserved.reservations(0).offset();
  const LeaseGrant lease = Grant(reserved);
  const std::string before = ArenaBytes(offset, 100000);
  const auto deadline = [] { return UcxKvClient::Clock::now() + kDeadline; };
  const store::ArenaRegion region{
      .index = 0, .offset = offset, .length = 100000, .bytes = Span(block)};

  LeaseGrant forged = lease;
  forged.key[1] ^= 1;
  EXPECT_EQ(ucx->Write(attached.worker_address(), forged, {&region, 1}, deadline()).code(),
            absl::StatusCode::kPermissionDenied);
  LeaseGrant other = lease;
  other.id ^= 1;
  EXPECT_EQ(ucx->Write(attached.worker_address(), other, {&region, 1}, deadline()).code(),
            absl::StatusCode::kPermissionDenied);
  store::ArenaRegion moved = region;
  moved.offset += 4096;
  EXPECT_EQ(ucx->Write(attached.worker_address(), lease, {&moved, 1}, deadline()).code(),
            absl::StatusCode::kInvalidArgument);
  store::ArenaRegion second = region;
  second.index = 1;
  EXPECT_EQ(ucx->Write(attached.worker_address(), lease, {&second, 1}, deadline()).code(),
            absl::StatusCode::kInvalidArgument);
  std::string read(100000, '\0');
  EXPECT_EQ(
      ucx->Read(attached.worker_address(), lease, {&region, 1}, {&read, 1}, deadline()).code(),
      absl::StatusCode::kPermissionDenied);  // a write lease does not read
  EXPECT_EQ(ArenaBytes(offset, 100000), before);
  EXPECT_EQ(service_->fabric()->Stats().put.refused, 4);
  EXPECT_EQ(service_->fabric()->Stats().get.refused, 1);

  ASSERT_TRUE(ucx->Write(attached.worker_address(), lease, {&region, 1}, deadline()).ok());
  EXPECT_EQ(ArenaBytes(offset, 100000), block);
  {
    tandem::v1::ReleaseShmRequest release;
    release.set_instance_id(attached.instance_id());
    release.set_lease_id(lease.id);
    grpc::ClientContext context;
    tandem::v1::ReleaseShmResponse released;
    ASSERT_TRUE(stub_->ReleaseShm(&context, release, &released).ok());
  }
  // The lease ended (its reservation abandoned): its key moves nothing any more.
  EXPECT_EQ(ucx->Write(attached.worker_address(), lease, {&region, 1}, deadline()).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(store_->Exists(9));
}

// A request that is not well formed is refused with its own id, so that its sender learns at
// once instead of at its deadline; one too short to carry an id is answered with id 0.
TEST_P(UcxDataPlaneTest, AMalformedRequestIsRefusedWithItsId) {
  const tandem::v1::AttachFabricResponse attached = Attach();
  const tandem::v1::ReserveShmResponse reserved = Reserve(attached.instance_id(), 5, 4000);
  ASSERT_TRUE(reserved.reservations(0).reserved());
  const LeaseGrant lease = Grant(reserved);
  absl::Mutex mu;
  std::vector<fabric::KvReplyHeader> replies;  // guarded by mu
  fabric::UcxWorkerOptions options;
  for (unsigned id : {fabric::kPutDone, fabric::kGetDone}) {
    options.handlers.emplace_back(id, [&](const void* header, size_t header_length, void*, size_t,
                                          const ucp_am_recv_param_t*) {
      fabric::KvReplyHeader reply;
      if (header_length == sizeof reply) {
        std::memcpy(&reply, header, sizeof reply);
        absl::MutexLock lock(&mu);
        replies.push_back(reply);
      }
      return UCS_OK;
    });
  }
  auto peer = fabric::UcxWorker::Create(std::move(options)).value();
  peer->Start();
  const std::string good =
      OneBlockHeader(lease, /*request_id=*/0, reserved.reservations(0).offset(), 4000);
  std::string two_blocks_one_ref = good;  // says 2 blocks and names 1
  fabric::KvRequestHeader h;
  std::memcpy(&h, two_blocks_one_ref.data(), sizeof h);
  h.count = 2;
  h.request_id = 71;
  std::memcpy(two_blocks_one_ref.data(), &h, sizeof h);
  std::string short_bytes = good;  // a well-formed header with fewer bytes than it names
  h.count = 1;
  h.request_id = 72;
  std::memcpy(short_bytes.data(), &h, sizeof h);
  std::string bad_get = two_blocks_one_ref;
  h.count = 2;
  h.request_id = 73;
  std::memcpy(bad_get.data(), &h, sizeof h);
  const std::string truncated = good.substr(0, sizeof h - 1);
  struct Message {
    unsigned id;
    const std::string* header;
    std::string_view bytes;
  };
  const Message messages[] = {{fabric::kPut, &two_blocks_one_ref, "x"},
                              {fabric::kPut, &short_bytes, "y"},
                              {fabric::kGet, &bad_get, {}},
                              {fabric::kGet, &truncated, {}}};
  peer->Post([&, address = attached.worker_address()] {
    for (const Message& m : messages) {
      if (ucs_status_ptr_t sent = SendWithReply(*peer, address, m.id, *m.header, m.bytes)) {
        ucp_request_free(sent);
      }
    }
  });
  ASSERT_TRUE(testing::Eventually([&] {
    absl::MutexLock lock(&mu);
    return replies.size() == 4;
  }));
  absl::MutexLock lock(&mu);
  std::vector<uint64_t> ids;
  for (const fabric::KvReplyHeader& reply : replies) {
    EXPECT_EQ(reply.code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
    ids.push_back(reply.request_id);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{0, 71, 72, 73}));
  EXPECT_EQ(service_->fabric()->Stats().put.refused, 2);
  EXPECT_EQ(service_->fabric()->Stats().get.refused, 2);
  EXPECT_EQ(service_->fabric()->Stats().put.blocks, 0);
}

// A worker's endpoint to a shard lasts as long as a path to the shard does: a shard that
// restarts (a new worker address, a new path) leaves no endpoint behind to its old self.
TEST_P(UcxDataPlaneTest, TheEndpointToAShardEndsWithItsLastPath) {
  const tandem::v1::AttachFabricResponse attached = Attach();
  auto ucx = UcxKvClient::Create(GetParam()).value();
  const auto path = [&] {
    return std::make_unique<store::UcxArenaPath>(
        ucx, attached.worker_address(), attached.instance_id(), attached.arena_bytes(), kDeadline);
  };
  const auto put = [&](store::UcxArenaPath& through, uint64_t hash) {
    const std::string block = Bytes(hash, 3000);
    const tandem::v1::ReserveShmResponse reserved = Reserve(attached.instance_id(), hash, 3000);
    const store::ArenaRegion region{.index = 0,
                                    .offset = reserved.reservations(0).offset(),
                                    .length = 3000,
                                    .bytes = Span(block)};
    return through.Write(Grant(reserved), {&region, 1}).status();
  };
  auto one = path();
  auto two = path();
  ASSERT_TRUE(put(*one, 61).ok());
  EXPECT_EQ(ucx->Stats().endpoints, 1);
  one.reset();  // the other path still uses the endpoint
  ASSERT_TRUE(put(*two, 62).ok());
  EXPECT_EQ(ucx->Stats().endpoints, 1);
  EXPECT_EQ(ucx->Stats().endpoints_created, 1);
  two.reset();
  ASSERT_TRUE(testing::Eventually([&] { return ucx->Stats().endpoints == 0; }));
  auto three = path();  // the shard attached again: a new endpoint
  ASSERT_TRUE(put(*three, 63).ok());
  EXPECT_EQ(ucx->Stats().endpoints, 1);
  EXPECT_EQ(ucx->Stats().endpoints_created, 2);
}

// A read lease's key reads its pinned blocks and nothing else, and only until the lease expires.
TEST_P(UcxDataPlaneTest, AReadKeyEndsWithItsLease) {
  server_->Shutdown();
  Start(std::chrono::milliseconds(300));
  ASSERT_TRUE(Client(false)->Put({{BlockData{21, Bytes(21, 70000)}}}).ok());
  const tandem::v1::AttachFabricResponse attached = Attach();
  const tandem::v1::AcquireShmResponse acquired = Acquire(attached.instance_id(), 21);
  ASSERT_TRUE(acquired.blocks(0).found());
  const LeaseGrant lease = Grant(acquired);
  const store::ArenaRegion region{.index = 0,
                                  .offset = acquired.blocks(0).offset(),
                                  .length = acquired.blocks(0).block_bytes(),
                                  .bytes = {}};
  auto ucx = UcxKvClient::Shared().value();
  const auto deadline = [] { return UcxKvClient::Clock::now() + kDeadline; };
  std::string read;
  ASSERT_TRUE(
      ucx->Read(attached.worker_address(), lease, {&region, 1}, {&read, 1}, deadline()).ok());
  EXPECT_EQ(read, Bytes(21, 70000));
  const std::string junk = Bytes(99, 70000);
  store::ArenaRegion write = region;
  write.bytes = Span(junk);
  EXPECT_EQ(ucx->Write(attached.worker_address(), lease, {&write, 1}, deadline()).code(),
            absl::StatusCode::kPermissionDenied);  // a read lease does not write
  ASSERT_TRUE(testing::Eventually([&] { return service_->shm().Stats().open_leases == 0; }));
  EXPECT_EQ(
      ucx->Read(attached.worker_address(), lease, {&region, 1}, {&read, 1}, deadline()).code(),
      absl::StatusCode::kPermissionDenied);
  auto got = Client(false)->Get(std::vector<uint64_t>{21});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], Bytes(21, 70000));
}

// A peer that never answers costs the deadline, not a hang; the endpoint is then rebuilt and
// the next transfer to a live shard succeeds.
TEST_P(UcxDataPlaneTest, APeerThatNeverAnswersCostsTheDeadline) {
  // It takes the blocks and never answers (a peer with no handler at all crashes UCX 1.13).
  fabric::UcxWorkerOptions options;
  options.handlers.emplace_back(fabric::kPut, [](const void*, size_t, void*, size_t,
                                                 const ucp_am_recv_param_t*) { return UCS_OK; });
  auto silent = fabric::UcxWorker::Create(std::move(options)).value();
  silent->Start();
  auto ucx = UcxKvClient::Shared().value();
  const std::string block = Bytes(3, 200000);
  const store::ArenaRegion region{
      .index = 0, .offset = 4096, .length = 200000, .bytes = Span(block)};
  const auto start = UcxKvClient::Clock::now();
  const absl::Status late = ucx->Write(silent->address(), LeaseGrant{.id = 1}, {&region, 1},
                                       start + std::chrono::milliseconds(300));
  EXPECT_FALSE(late.ok());
  EXPECT_LT(UcxKvClient::Clock::now() - start, std::chrono::seconds(5));
  auto fabric = Client(true);
  ASSERT_TRUE(fabric->Put({{BlockData{30, block}}}).ok());
  EXPECT_TRUE(fabric->fabric_attached());
  EXPECT_EQ(service_->fabric()->Stats().put.blocks, 1);
}

// A reader that stops taking its bytes mid-transfer (a worker stopped, or killed: UCX 1.13's
// shared-memory transports never tell) holds its block's pin until the lease time, not until
// the shard restarts; the shard serves everyone else meanwhile and after.
TEST_P(UcxDataPlaneTest, AStalledReaderLetsGoOfItsPinAtTheLeaseTime) {
  server_->Shutdown();
  Start(std::chrono::milliseconds(300));
  const std::string block = Bytes(41, 1 << 20);  // a rendezvous: the shard waits for the reader
  ASSERT_TRUE(Client(false)->Put({{BlockData{41, block}}}).ok());
  const tandem::v1::AttachFabricResponse attached = Attach();
  const tandem::v1::AcquireShmResponse acquired = Acquire(attached.instance_id(), 41);
  ASSERT_TRUE(acquired.blocks(0).found());
  const LeaseGrant lease = Grant(acquired);

  // The reader asks for the block, and keeps the shard's offer of the bytes without taking them.
  std::atomic<int> offers = 0;
  fabric::UcxWorkerOptions options;
  options.handlers.emplace_back(fabric::kGetDone, [&offers](const void*, size_t, void*, size_t,
                                                            const ucp_am_recv_param_t* param) {
    ++offers;
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_INPROGRESS : UCS_OK;
  });
  auto reader = fabric::UcxWorker::Create(std::move(options)).value();
  reader->Start();
  const std::string header = OneBlockHeader(lease, /*request_id=*/7, acquired.blocks(0).offset(),
                                            acquired.blocks(0).block_bytes());
  reader->Post([&reader, &header, address = attached.worker_address()] {
    if (ucs_status_ptr_t sent = SendWithReply(*reader, address, fabric::kGet, header)) {
      ucp_request_free(sent);
    }
  });
  ASSERT_TRUE(testing::Eventually([&] { return offers == 1; }));
  // The lease ends (expires) while the transfer is offered; at the lease time the transfer is
  // cancelled. Where UCX can cancel it (tcp) it held the pin until then; where it cannot (sm),
  // it sent a copy and held none.
  ASSERT_TRUE(testing::Eventually([&] {
    return service_->shm().Stats().open_leases == 0 && store_->Stats().pinned_blocks == 0 &&
           service_->fabric()->Stats().get.timed_out == 1;
  }));
  EXPECT_EQ(service_->fabric()->Stats().get.blocks, 0);
  auto got = Client(true)->Get(std::vector<uint64_t>{41});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], block);
  // Counted when the shard's send completes, which may be after the bytes arrived.
  EXPECT_TRUE(testing::Eventually([&] { return service_->fabric()->Stats().get.blocks == 1; }));
}

// A writer that stops answering mid-transfer (its UCX thread blocked right after it offered
// the bytes) holds its reservation until the lease time, not until the shard restarts.
TEST_P(UcxDataPlaneTest, AStalledWriterLetsGoOfItsReservationAtTheLeaseTime) {
  server_->Shutdown();
  Start(std::chrono::milliseconds(300));
  const tandem::v1::AttachFabricResponse attached = Attach();
  const std::string block = Bytes(42, 1 << 20);  // a rendezvous: the shard waits for the writer
  const tandem::v1::ReserveShmResponse reserved =
      Reserve(attached.instance_id(), 42, static_cast<int64_t>(block.size()));
  ASSERT_TRUE(reserved.reservations(0).reserved());
  const LeaseGrant lease = Grant(reserved);
  const std::string header =
      OneBlockHeader(lease, /*request_id=*/8, reserved.reservations(0).offset(),
                     static_cast<int64_t>(block.size()));
  std::atomic<int> answers = 0;
  fabric::UcxWorkerOptions options;
  options.handlers.emplace_back(
      fabric::kPutDone, [&answers](const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
        ++answers;
        return UCS_OK;
      });
  auto writer = fabric::UcxWorker::Create(std::move(options)).value();
  writer->Start();
  // First a put the shard refuses, so that the endpoint is wired up both ways and the next
  // send leaves at once, without the writer's thread.
  const std::string junk(fabric::KvHeaderBytes(1), 'j');
  writer->Post([&, address = attached.worker_address()] {
    if (ucs_status_ptr_t request = SendWithReply(*writer, address, fabric::kPut, junk)) {
      ucp_request_free(request);
    }
  });
  ASSERT_TRUE(testing::Eventually([&] { return answers == 1; }));
  absl::Notification sent, resume;
  writer->Post([&, address = attached.worker_address()] {
    ucs_status_ptr_t request = SendWithReply(*writer, address, fabric::kPut, header, block);
    sent.Notify();
    resume.WaitForNotification();  // the writer's UCX thread stops here: nothing progresses
    if (request != nullptr) ucp_request_free(request);
  });
  sent.WaitForNotification();
  // The lease expires, and the transfer is cancelled at the lease time (tcp: the shard waits
  // for the bytes), or completed without the writer's help (sm: the shard copies them itself).
  const bool cancellable = std::string(GetParam()) == "tcp";
  EXPECT_TRUE(testing::Eventually([&] {
    return service_->shm().Stats().open_leases == 0 && store_->Stats().pending_puts == 0 &&
           service_->fabric()->Stats().put.timed_out + service_->fabric()->Stats().put.blocks == 1;
  }));
  EXPECT_EQ(service_->fabric()->Stats().put.timed_out, cancellable ? 1 : 0);
  EXPECT_FALSE(store_->Exists(42));  // never committed
  resume.Notify();
  auto fabric = Client(true);
  ASSERT_TRUE(fabric->Put({{BlockData{42, block}}}).ok());
  auto got = fabric->Get(std::vector<uint64_t>{42});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], block);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxDataPlaneTest, ::testing::Values("tcp", "sm,self"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param[0] == 't' ? "Tcp" : "SharedMemory");
                         });

// UCX's own log lines go through Tandem's log (stderr, its format), not UCX's printer on
// stdout; the error UCX logs when the peer-failure probe fails as expected (shared memory) is
// dropped, and Tandem says what it means instead.
TEST(UcxWorkerTest, UcxLogsThroughTandemAndAnExpectedFailureIsQuiet) {
  setenv("UCX_TLS", "sm,self", 1);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  auto worker = fabric::UcxWorker::Create({}).value();
  worker->Start();
  absl::Notification probed;
  bool detects = true;
  worker->Post([&] {
    detects = worker->detects_peer_failures();
    probed.Notify();
  });
  probed.WaitForNotification();
  ucs_warn("a warning from inside UCX, %d", 42);
  worker.reset();
  std::fflush(stdout);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(detects);  // UCX 1.13's shared-memory transports cannot tell a peer failed
  EXPECT_EQ(out.find("UCX"), std::string::npos) << out;
  EXPECT_EQ(err.find("no peer failure handler"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot detect a failed peer"), std::string::npos) << err;
  EXPECT_NE(err.find(" W ucx: a warning from inside UCX, 42 (UCX "), std::string::npos) << err;
  unsetenv("UCX_TLS");
}

// A transfer borrows its lease: a write lease is not committed under it, and a lease ended
// under a transfer keeps what it holds until the transfer lets go.
TEST(ShmLeasesTest, ATransferKeepsItsLeaseUntilItEnds) {
  auto store = BlockStore::Create({.capacity_bytes = 1 << 20, .shared_memory = true}).value();
  ShmLeases leases({});
  ShmLeases::Lease write;
  write.puts.push_back(store->BeginPut(1, 1000, 0).value());
  const ShmLeases::Added w = leases.Add(std::move(write), "me", /*keyed=*/true).value();
  EXPECT_NE(w.key, (ShmLeases::Key{0, 0}));
  EXPECT_EQ(leases.Borrow(w.id, {w.key[0], w.key[1] + 1}, ShmLeases::Kind::kWrite).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(leases.Borrow(w.id, w.key, ShmLeases::Kind::kRead).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto borrowed = leases.Borrow(w.id, w.key, ShmLeases::Kind::kWrite);
  ASSERT_TRUE(borrowed.ok());
  EXPECT_EQ(leases.Take(w.id, ShmLeases::Kind::kWrite, "me").status().code(),
            absl::StatusCode::kFailedPrecondition);
  borrowed->reset();
  EXPECT_TRUE(leases.Take(w.id, ShmLeases::Kind::kWrite, "me").ok());

  PendingPut second = store->BeginPut(2, 500, 0).value();
  std::memset(second.data().data(), 'x', 500);
  ASSERT_TRUE(second.CommitInPlace(0, /*verify=*/false).ok());
  ShmLeases::Lease read;
  read.pins.push_back(store->Get(2, ChecksumKind::kXxh3).value());
  const ShmLeases::Added r = leases.Add(std::move(read), "me", /*keyed=*/true).value();
  auto reading = leases.Borrow(r.id, r.key, ShmLeases::Kind::kRead);
  ASSERT_TRUE(reading.ok());
  ASSERT_TRUE(leases.Take(r.id, ShmLeases::Kind::kAny, "me").ok());  // released mid-transfer
  EXPECT_EQ(store->Stats().pinned_blocks, 1);
  EXPECT_EQ(leases.Borrow(r.id, r.key, ShmLeases::Kind::kRead).status().code(),
            absl::StatusCode::kPermissionDenied);
  reading->reset();
  EXPECT_EQ(store->Stats().pinned_blocks, 0);
  // A lease without a key is never borrowed.
  ShmLeases::Lease unkeyed;
  unkeyed.pins.push_back(store->Get(2, ChecksumKind::kXxh3).value());
  const ShmLeases::Added plain = leases.Add(std::move(unkeyed)).value();
  EXPECT_EQ(leases.Borrow(plain.id, plain.key, ShmLeases::Kind::kRead).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace tandem::cache_store
