// The shard's shared-memory handoff driven directly (no gRPC): writes through the arena are
// invisible until committed and checked, pins and reservations hold off eviction, and leases a
// client never ends are ended by expiry.
#include "cache_store/shm_handoff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "tests/unit/testing/eventually.h"

namespace tandem::cache_store {
namespace {

using tandem::v1::AcquireShmRequest;
using tandem::v1::AcquireShmResponse;
using tandem::v1::CommitShmRequest;
using tandem::v1::CommitShmResponse;
using tandem::v1::ReleaseShmRequest;
using tandem::v1::ReserveShmRequest;
using tandem::v1::ReserveShmResponse;
using ::testing::HasSubstr;

std::vector<uint8_t> Content(uint64_t hash, int64_t size) {
  std::vector<uint8_t> v(size);
  for (int64_t i = 0; i < size; ++i) v[i] = static_cast<uint8_t>(hash * 37 + i * 11 + (i >> 9));
  return v;
}

class ShmHandoffTest : public ::testing::Test {
 protected:
  void Start(int64_t capacity, std::chrono::milliseconds ttl = std::chrono::seconds(30),
             int max_leases = 4096, bool verify_commits = false) {
    store_ = BlockStore::Create({.capacity_bytes = capacity}).value();
    ASSERT_NE(store_->arena(), nullptr);
    handoff_ = std::make_unique<ShmHandoff>(
        *store_, ShmHandoffOptions{.leases = {.ttl = ttl, .max_leases = max_leases},
                                   .verify_commits = verify_commits});
  }
  void TearDown() override { handoff_.reset(); }

  uint64_t instance() const { return store_->arena()->instance_id(); }
  // The arena as a client maps it: file offsets from the start of the header page.
  uint8_t* At(int64_t offset) const {
    return store_->arena()->data() - store::kShmHeaderBytes + offset;
  }

  absl::StatusOr<ReserveShmResponse> Reserve(std::vector<std::pair<uint64_t, int64_t>> blocks,
                                             bool ahead = false) {
    ReserveShmRequest request;
    request.set_instance_id(instance());
    request.set_ahead(ahead);
    for (auto [hash, size] : blocks) {
      auto* b = request.add_blocks();
      b->set_block_hash(hash);
      b->set_block_bytes(size);
    }
    ReserveShmResponse response;
    absl::Status s = handoff_->Reserve(request, &response);
    if (!s.ok()) return s;
    return response;
  }

  absl::Status Commit(uint64_t lease, std::vector<uint64_t> checksums,
                      const std::string& peer = "") {
    CommitShmRequest request;
    request.set_instance_id(instance());
    request.set_lease_id(lease);
    for (uint64_t c : checksums) request.add_checksums(c);
    CommitShmResponse response;
    return handoff_->Commit(request, &response, peer);
  }

  absl::StatusOr<AcquireShmResponse> Acquire(std::vector<uint64_t> hashes) {
    AcquireShmRequest request;
    request.set_instance_id(instance());
    for (uint64_t h : hashes) request.add_block_hashes(h);
    AcquireShmResponse response;
    absl::Status s = handoff_->Acquire(request, &response);
    if (!s.ok()) return s;
    return response;
  }

  absl::Status Release(uint64_t lease, const std::string& peer = "") {
    ReleaseShmRequest request;
    request.set_instance_id(instance());
    request.set_lease_id(lease);
    return handoff_->Release(request, peer);
  }

  // Reserves, writes and commits one block through the arena.
  void PutThroughArena(uint64_t hash, int64_t size) {
    auto r = Reserve({{hash, size}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->reservations(0).reserved());
    const auto data = Content(hash, size);
    std::memcpy(At(r->reservations(0).offset()), data.data(), size);
    ASSERT_TRUE(Commit(r->lease_id(), {store::BlockChecksum64(data)}).ok());
  }

  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<ShmHandoff> handoff_;
};

TEST_F(ShmHandoffTest, AReservedBlockIsInvisibleUntilCommitted) {
  Start(1 << 20);
  tandem::v1::AttachSharedMemoryResponse attach;
  ASSERT_TRUE(handoff_->Attach(&attach).ok());
  EXPECT_EQ(attach.instance_id(), instance());
  EXPECT_EQ(attach.file_bytes(), store_->arena()->file_bytes());
  EXPECT_EQ(attach.lease_ms(), 30000);
  EXPECT_FALSE(attach.preallocated());

  auto r = Reserve({{1, 3000}, {2, 100}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->lease_id(), 0u);
  ASSERT_EQ(r->reservations_size(), 2);
  const auto one = Content(1, 3000);
  const auto two = Content(2, 100);
  std::memcpy(At(r->reservations(0).offset()), one.data(), one.size());
  std::memcpy(At(r->reservations(1).offset()), two.data(), two.size());
  EXPECT_FALSE(store_->Exists(1));
  EXPECT_EQ(store_->Get(1).status().code(), absl::StatusCode::kNotFound);
  auto a = Acquire({1, 2});
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->blocks(0).found());
  EXPECT_EQ(a->lease_id(), 0u);  // nothing pinned, no lease
  EXPECT_EQ(store_->Stats().pending_puts, 2);

  ASSERT_TRUE(
      Commit(r->lease_id(), {store::BlockChecksum64(one), store::BlockChecksum64(two)}).ok());
  EXPECT_TRUE(store_->Exists(1));
  auto ref = store_->Get(1);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(std::vector<uint8_t>(ref->data().begin(), ref->data().end()), one);
  EXPECT_EQ(ref->checksum(), store::BlockChecksum(one));  // what a streamed Get will send
  EXPECT_EQ(Commit(r->lease_id(), {}).code(), absl::StatusCode::kNotFound);  // lease ended

  auto again = Reserve({{1, 3000}, {3, 10}});  // 1 is stored: skipped
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->reservations(0).reserved());
  EXPECT_TRUE(again->reservations(1).reserved());
  EXPECT_TRUE(Release(again->lease_id()).ok());  // abandons 3
  const ShmHandoffStats s = handoff_->Stats();
  EXPECT_EQ(s.reserved_blocks, 3);
  EXPECT_EQ(s.committed_blocks, 2);
  EXPECT_EQ(s.open_leases, 0);
  EXPECT_EQ(store_->Stats().pending_puts, 0);
  EXPECT_EQ(store_->Stats().used_bytes, 3100);
}

// Reserved ahead (before the bytes exist), a block another writer is writing is left to it
// and marked pending; reserved with the bytes in hand, it gets space of its own.
TEST_F(ShmHandoffTest, ABlockBeingWrittenIsPendingAheadAndReservedAgainOtherwise) {
  Start(1 << 20);
  auto first = Reserve({{1, 100}}, /*ahead=*/true);
  ASSERT_TRUE(first.ok() && first->reservations(0).reserved());
  auto ahead = Reserve({{1, 100}, {2, 100}}, /*ahead=*/true);
  ASSERT_TRUE(ahead.ok());
  EXPECT_FALSE(ahead->reservations(0).reserved());
  EXPECT_TRUE(ahead->reservations(0).pending());
  EXPECT_TRUE(ahead->reservations(1).reserved());
  EXPECT_FALSE(ahead->reservations(1).pending());

  auto now = Reserve({{1, 100}});
  ASSERT_TRUE(now.ok() && now->reservations(0).reserved());
  EXPECT_NE(now->reservations(0).offset(), first->reservations(0).offset());
  const auto data = Content(1, 100);
  std::memcpy(At(now->reservations(0).offset()), data.data(), data.size());
  ASSERT_TRUE(Commit(now->lease_id(), {store::BlockChecksum64(data)}).ok());
  EXPECT_TRUE(store_->Exists(1));  // while the first writer still holds its space

  auto stored = Reserve({{1, 100}}, /*ahead=*/true);  // stored: neither reserved nor pending
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(stored->reservations(0).reserved());
  EXPECT_FALSE(stored->reservations(0).pending());
  EXPECT_TRUE(Release(first->lease_id()).ok());
  EXPECT_TRUE(Release(ahead->lease_id()).ok());
  EXPECT_EQ(store_->Stats().pending_puts, 0);
  EXPECT_EQ(store_->Stats().used_bytes, 100);
}

TEST_F(ShmHandoffTest, AcquirePinsUntilReleased) {
  Start(1 << 20);
  PutThroughArena(5, 4000);
  auto a = Acquire({5, 6});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->blocks(0).found());
  EXPECT_FALSE(a->blocks(1).found());
  EXPECT_EQ(a->blocks(0).block_bytes(), 4000);
  EXPECT_EQ(a->blocks(0).checksum(), store::BlockChecksum64(Content(5, 4000)));
  EXPECT_EQ(std::memcmp(At(a->blocks(0).offset()), Content(5, 4000).data(), 4000), 0);
  EXPECT_EQ(store_->Stats().pinned_blocks, 1);
  // A read lease cannot be committed, and that does not end it.
  EXPECT_EQ(Commit(a->lease_id(), {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Release(a->lease_id()).ok());
  EXPECT_EQ(store_->Stats().pinned_blocks, 0);
  EXPECT_EQ(Release(a->lease_id()).code(), absl::StatusCode::kNotFound);
}

// A lease is bound to the connection that took it: another client cannot commit someone's
// reservation (writing a block it did not fill) or release someone's pins.
TEST_F(ShmHandoffTest, LeasesAreBoundToTheConnectionThatTookThem) {
  Start(1 << 20);
  PutThroughArena(5, 4000);
  AcquireShmRequest acquire;
  acquire.set_instance_id(instance());
  acquire.add_block_hashes(5);
  AcquireShmResponse pinned;
  ASSERT_TRUE(handoff_->Acquire(acquire, &pinned, "ipv4:127.0.0.1:1111").ok());
  EXPECT_EQ(Release(pinned.lease_id(), "ipv4:127.0.0.1:2222").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(store_->Stats().pinned_blocks, 1);  // still pinned
  EXPECT_TRUE(Release(pinned.lease_id(), "ipv4:127.0.0.1:1111").ok());

  ReserveShmRequest reserve;
  reserve.set_instance_id(instance());
  auto* b = reserve.add_blocks();
  b->set_block_hash(6);
  b->set_block_bytes(100);
  ReserveShmResponse reserved;
  ASSERT_TRUE(handoff_->Reserve(reserve, &reserved, "ipv4:127.0.0.1:1111").ok());
  const auto data = Content(6, 100);
  std::memcpy(At(reserved.reservations(0).offset()), data.data(), 100);
  EXPECT_EQ(
      Commit(reserved.lease_id(), {store::BlockChecksum64(data)}, "ipv4:127.0.0.1:2222").code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(store_->Exists(6));
  EXPECT_TRUE(
      Commit(reserved.lease_id(), {store::BlockChecksum64(data)}, "ipv4:127.0.0.1:1111").ok());
  EXPECT_TRUE(store_->Exists(6));
}

// The segment has no name anyone could guess (an anonymous memfd, reached through the shard's
// own /proc/PID/fd) and is its owner's alone.
TEST_F(ShmHandoffTest, TheSegmentIsOwnerOnly) {
  Start(1 << 20);
  struct stat st;
  ASSERT_EQ(stat(store_->arena()->path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(st.st_uid, getuid());
}

TEST_F(ShmHandoffTest, BadRequestsAreRefusedAndLeaveNothingBehind) {
  Start(1 << 20);
  EXPECT_EQ(Reserve({{1, 100}, {2, 0}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Reserve({{1, -5}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Reserve({{1, int64_t{1} << 40}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Reserve({{1, 600 << 10}, {2, 600 << 10}}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Stats().pending_puts, 0);  // the first reservations were undone

  ReserveShmRequest stale;
  stale.set_instance_id(instance() + 1);
  ReserveShmResponse ignored;
  absl::Status s = handoff_->Reserve(stale, &ignored);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("attach again"));

  std::vector<std::pair<uint64_t, int64_t>> many(ShmHandoffOptions().max_blocks_per_call + 1,
                                                 {1, 1});
  EXPECT_EQ(Reserve(many).status().code(), absl::StatusCode::kInvalidArgument);

  auto r = Reserve({{7, 100}, {8, 100}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Commit(r->lease_id(), {1}).code(), absl::StatusCode::kInvalidArgument);  // count
  EXPECT_FALSE(store_->Exists(7));
  EXPECT_EQ(Commit(12345, {}).code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(handoff_->Stats().open_leases, 0);
}

// A block whose bytes do not match the writer's checksum is refused at Commit when the shard
// verifies commits; when it does not (the default), it is stored but no reader ever gets it:
// the shard checks it before vouching for it with a stream checksum and drops it.
TEST_F(ShmHandoffTest, BytesThatDoNotMatchTheWritersChecksumNeverReachAReader) {
  for (const bool verify : {true, false}) {
    SCOPED_TRACE(verify ? "verify commits" : "readers verify");
    Start(1 << 20, std::chrono::seconds(30), 4096, verify);
    auto w = Reserve({{7, 100}, {8, 100}});
    ASSERT_TRUE(w.ok());
    const auto seven = Content(7, 100);
    std::memcpy(At(w->reservations(0).offset()), seven.data(), 100);
    std::memset(At(w->reservations(1).offset()), 0, 100);
    const absl::Status commit =
        Commit(w->lease_id(), {store::BlockChecksum64(seven), store::BlockChecksum64(seven)});
    EXPECT_TRUE(store_->Exists(7));
    EXPECT_EQ(handoff_->Stats().open_leases, 0);
    if (verify) {
      // One block matches, one does not: the good one is stored, the call says DATA_LOSS.
      EXPECT_EQ(commit.code(), absl::StatusCode::kDataLoss);
      EXPECT_FALSE(store_->Exists(8));
    } else {
      ASSERT_TRUE(commit.ok());
      EXPECT_EQ(store_->Get(8).status().code(), absl::StatusCode::kDataLoss);
      EXPECT_FALSE(store_->Exists(8));
      EXPECT_EQ(store_->Stats().corrupt, 1);
    }
    const BlockStoreStats stats = store_->Stats();
    EXPECT_EQ(stats.pending_puts, 0);
    EXPECT_EQ(stats.used_bytes, 100);
    EXPECT_EQ(stats.pinned_blocks, 0);
    handoff_.reset();
  }
}

TEST_F(ShmHandoffTest, EvictionNeverTouchesPinnedOrReservedSpace) {
  Start(4 * 4096);
  PutThroughArena(1, 4096);
  auto pin = Acquire({1});
  ASSERT_TRUE(pin.ok());
  auto r = Reserve({{2, 4096}});
  ASSERT_TRUE(r.ok());
  const auto two = Content(2, 4096);
  std::memcpy(At(r->reservations(0).offset()), two.data(), two.size());
  // Many more blocks than fit: each evicts an older unpinned one, never 1 or the reservation.
  for (uint64_t h = 10; h < 30; ++h) PutThroughArena(h, 4096);
  EXPECT_EQ(Reserve({{99, 3 * 4096}}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_->Exists(1));
  EXPECT_EQ(std::memcmp(At(pin->blocks(0).offset()), Content(1, 4096).data(), 4096), 0);
  ASSERT_TRUE(
      Commit(r->lease_id(), {store::BlockChecksum64(two)}).ok());  // its bytes were untouched
  EXPECT_TRUE(store_->Exists(2));
  EXPECT_TRUE(Release(pin->lease_id()).ok());
  EXPECT_GT(store_->Stats().evictions, 15);
}

// A client that reserves or acquires and then disappears: its lease expires, and the space and
// pins come back without anyone calling.
TEST_F(ShmHandoffTest, LeasesOfAVanishedClientExpire) {
  Start(1 << 20, std::chrono::milliseconds(50));
  PutThroughArena(1, 1000);
  auto pin = Acquire({1});
  ASSERT_TRUE(pin.ok());
  auto r = Reserve({{2, 2000}, {3, 3000}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(store_->Stats().pinned_blocks, 1);
  EXPECT_EQ(store_->Stats().used_bytes, 6000);
  // An expired lease leaves the table first and ends (unpins) after the table's lock is dropped.
  ASSERT_TRUE(testing::Eventually([&] {
    return handoff_->Stats().open_leases == 0 && store_->Stats().pinned_blocks == 0 &&
           store_->Stats().pending_puts == 0;
  }));
  const BlockStoreStats s = store_->Stats();
  EXPECT_EQ(s.pinned_blocks, 0);
  EXPECT_EQ(s.pending_puts, 0);
  EXPECT_EQ(s.used_bytes, 1000);
  EXPECT_EQ(handoff_->Stats().expired_leases, 2);
  // The late client learns its lease is gone; nothing it sends becomes visible.
  EXPECT_EQ(Commit(r->lease_id(), {0, 0}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Release(pin->lease_id()).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store_->Exists(2));
}

TEST_F(ShmHandoffTest, OpenLeasesAreBounded) {
  Start(1 << 20, std::chrono::seconds(30), 2);
  PutThroughArena(1, 100);
  auto a = Acquire({1});
  auto b = Acquire({1});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Acquire({1}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Reserve({{2, 10}}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Stats().pending_puts, 0);
  EXPECT_TRUE(Release(a->lease_id()).ok());
  EXPECT_TRUE(Acquire({1}).ok());
}

TEST(ShmHandoffPreallocatedTest, AttachingSaysTheArenaIsAllocated) {
  auto store = BlockStore::Create({.capacity_bytes = 1 << 20, .preallocate = true}).value();
  ShmHandoff handoff(*store, {});
  tandem::v1::AttachSharedMemoryResponse attach;
  ASSERT_TRUE(handoff.Attach(&attach).ok());
  EXPECT_TRUE(attach.preallocated());
}

TEST(ShmHandoffPrivateTest, AnArenaKeptForTheFabricAloneIsNotHandedOut) {
  auto store = BlockStore::Create({.capacity_bytes = 1 << 20}).value();
  ShmHandoff handoff(*store, {.offer_shared_memory = false});
  tandem::v1::AttachSharedMemoryResponse attach;
  const absl::Status refused = handoff.Attach(&attach);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("cache_store.shared_memory: false"));
  EXPECT_TRUE(attach.path().empty());
}

TEST(ShmHandoffPrivateTest, WithoutAnArenaEveryCallIsFailedPrecondition) {
  auto store = BlockStore::Create({.capacity_bytes = 1 << 20, .shared_memory = false}).value();
  ShmHandoff handoff(*store, {});
  tandem::v1::AttachSharedMemoryResponse attach;
  EXPECT_EQ(handoff.Attach(&attach).code(), absl::StatusCode::kFailedPrecondition);
  ReserveShmResponse reserved;
  EXPECT_EQ(handoff.Reserve(ReserveShmRequest(), &reserved).code(),
            absl::StatusCode::kFailedPrecondition);
  AcquireShmResponse acquired;
  EXPECT_EQ(handoff.Acquire(AcquireShmRequest(), &acquired).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tandem::cache_store
