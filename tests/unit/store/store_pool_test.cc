// The prefill -> store -> decode handoff over real gRPC cache-store shards on loopback: blocks
// exported by one engine, spread over two shards, fetched and imported by another engine, which
// continues the request exactly. A shard that goes away turns its blocks into misses, and the
// output is still right.
#include "common/store/store_pool.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "cache_store/cache_store_service.h"
#include "common/engine/kv_handoff.h"
#include "tests/unit/testing/eventually.h"
#include "tests/unit/testing/serving.h"
#include "tests/unit/testing/temp_model.h"

namespace tandem::store {
namespace {

struct Shard {
  std::unique_ptr<cache_store::BlockStore> store;
  std::unique_ptr<cache_store::CacheStoreService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

std::unique_ptr<Shard> StartShard(const cache_store::ShmHandoffOptions& shm = {}) {
  auto shard = std::make_unique<Shard>();
  shard->store = cache_store::BlockStore::Create({.capacity_bytes = 64 << 20}).value();
  shard->service = std::make_unique<cache_store::CacheStoreService>(*shard->store, 4096, shm);
  shard->server = testing::ServeOnLoopback(shard->service.get(), &shard->address);
  return shard;
}

class StorePoolTest : public testing::TinyModelTest {
 protected:
  void SetUp() override {
    TinyModelTest::SetUp();
    for (int i = 0; i < 100; ++i) prompt_.push_back((i * 29 + 3) % 128);  // 6 full blocks + 4
    shards_.push_back(StartShard());
    shards_.push_back(StartShard());
  }
  void TearDown() override {
    for (auto& s : shards_) {
      if (s->server) s->server->Shutdown();
    }
  }

  std::vector<int32_t> Run(engine::Engine& e, std::vector<int32_t> prompt, int max_tokens,
                           int num_generated, int* cached = nullptr) {
    testing::RunResult r = testing::RunToCompletion(
        e, testing::GreedyRequest("r", std::move(prompt), max_tokens, num_generated));
    if (cached != nullptr) *cached = r.cached_prompt_tokens;
    return r.tokens;
  }

  // Prefill on a fresh engine and upload; returns the first token and the block list.
  std::pair<int32_t, std::vector<BlockData>> Prefill(StorePool& pool) {
    auto e = MakeEngine();
    const int32_t first = Run(*e, prompt_, 1, 0).at(0);
    auto exported = engine::ExportPromptBlocks(*e, prompt_);
    EXPECT_TRUE(exported.ok());
    std::vector<BlockData> blocks;
    for (auto& b : *exported) blocks.push_back({b.hash, std::move(b.bytes)});
    return {first, blocks};
  }

  // Decode on a fresh engine from what the store holds; returns the continuation.
  std::vector<int32_t> Decode(StorePool& pool, int32_t first, engine::ImportStats* stats,
                              int* cached) {
    auto e = MakeEngine();
    const auto hashes = engine::PromptBlockHashes(*e, prompt_);
    const auto fetched = pool.Get(hashes);
    *stats = engine::ImportPromptBlocks(*e, hashes, fetched);
    std::vector<int32_t> resumed = prompt_;
    resumed.push_back(first);
    return Run(*e, resumed, 8, 1, cached);
  }

  // Blocks the shards took in or handed out through shared memory.
  int64_t ShmCommitted() const {
    int64_t n = 0;
    for (const auto& s : shards_) n += s->service->shm().Stats().committed_blocks;
    return n;
  }
  int64_t ShmReserved() const {
    int64_t n = 0;
    for (const auto& s : shards_) n += s->service->shm().Stats().reserved_blocks;
    return n;
  }
  int64_t ShmOpenLeases() const {
    int64_t n = 0;
    for (const auto& s : shards_) n += s->service->shm().Stats().open_leases;
    return n;
  }
  // The sizes of `blocks`, as a prefill worker knows them before it has the bytes.
  static std::vector<BlockSize> Sizes(const std::vector<BlockData>& blocks) {
    std::vector<BlockSize> sizes;
    for (const BlockData& b : blocks) sizes.push_back({b.hash, std::ssize(b.bytes)});
    return sizes;
  }
  int64_t ShmAcquired() const {
    int64_t n = 0;
    for (const auto& s : shards_) n += s->service->shm().Stats().acquired_blocks;
    return n;
  }

  std::vector<int32_t> prompt_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

TEST_F(StorePoolTest, HandoffThroughTwoShardsIsExact) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, prompt_, 8, 0);

  StorePool pool({shards_[0]->address, shards_[1]->address}, "tiny");
  auto [first, blocks] = Prefill(pool);
  ASSERT_EQ(first, expected[0]);
  ASSERT_EQ(blocks.size(), 6u);
  StorePool::PutReport put = pool.Put(blocks);
  EXPECT_EQ(put.uploaded, 6);
  EXPECT_EQ(put.stored, std::vector<bool>(6, true));
  // Each block went to the shard the ring places it on (ports are random, so which shard that
  // is varies from run to run; all six on one shard happens).
  int64_t on_first = 0;
  for (const auto& b : blocks) on_first += pool.ShardOf(b.hash) == shards_[0]->address;
  EXPECT_EQ(shards_[0]->store->Stats().blocks, on_first);
  EXPECT_EQ(shards_[1]->store->Stats().blocks, 6 - on_first);
  EXPECT_EQ(pool.Put(blocks).uploaded, 0);  // already stored: no bytes sent again
  EXPECT_EQ(ShmCommitted(), 6);             // loopback shards: the shared-memory path

  engine::ImportStats stats;
  int cached = -1;
  const auto rest = Decode(pool, first, &stats, &cached);
  EXPECT_EQ(stats.hits, 6);
  EXPECT_EQ(stats.misses, 0);
  EXPECT_EQ(cached, 96);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(ShmAcquired(), 6);
}

// A worker connects to its shards in the background as it starts (StorePool::ConnectInBackground)
// while its first requests may already run: the handoff stays exact and takes the shared-memory
// path, and a pool destroyed right after starting to connect waits for it.
TEST_F(StorePoolTest, ConnectingInTheBackgroundWhileRequestsRunIsExact) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, prompt_, 8, 0);
  {
    StorePool short_lived({shards_[0]->address, shards_[1]->address}, "tiny");
    short_lived.ConnectInBackground();
  }
  StorePool pool({shards_[0]->address, shards_[1]->address}, "tiny");
  pool.ConnectInBackground();
  auto [first, blocks] = Prefill(pool);
  ASSERT_EQ(first, expected[0]);
  EXPECT_EQ(pool.Put(blocks).stored, std::vector<bool>(6, true));
  EXPECT_EQ(ShmCommitted(), 6);
  engine::ImportStats stats;
  int cached = -1;
  const auto rest = Decode(pool, first, &stats, &cached);
  EXPECT_EQ(stats.hits, 6);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));
}

// A prefill worker reserves the prompt's blocks while its engine computes them
// (engine::ExportPlan gives their hashes and sizes ahead); the put is then a copy and one Commit
// per shard, and decode continues exactly.
TEST_F(StorePoolTest, APutThroughAReservationMadeAheadIsOneCommit) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, prompt_, 8, 0);
  StorePool pool({shards_[0]->address, shards_[1]->address}, "tiny");

  auto prefill = MakeEngine();
  const engine::ExportPlan plan = engine::ExportPlan::Of(*prefill);
  std::vector<BlockSize> ahead;
  for (uint64_t hash : plan.Hashes(prompt_, 0)) ahead.push_back({hash, plan.block_bytes()});
  ASSERT_EQ(ahead.size(), 6u);
  std::unique_ptr<StorePool::Reservation> reservation = pool.Reserve(ahead);
  EXPECT_EQ(reservation->reserved_bytes(), 6 * plan.block_bytes());
  EXPECT_EQ(ShmReserved(), 6);

  const int32_t first = Run(*prefill, prompt_, 1, 0).at(0);
  auto exported = engine::ExportPromptBlocks(*prefill, prompt_);
  ASSERT_TRUE(exported.ok());
  std::vector<BlockData> blocks;
  for (auto& b : *exported) blocks.push_back({b.hash, std::move(b.bytes)});
  ASSERT_EQ(Sizes(blocks).size(), ahead.size());
  for (size_t i = 0; i < ahead.size(); ++i) {  // the plan knew them exactly
    EXPECT_EQ(Sizes(blocks)[i].hash, ahead[i].hash);
    EXPECT_EQ(Sizes(blocks)[i].bytes, ahead[i].bytes);
  }

  const StorePool::PutReport put = pool.Put(blocks, reservation.get());
  EXPECT_EQ(put.stored, std::vector<bool>(6, true));
  EXPECT_EQ(put.uploaded, 6);
  EXPECT_EQ(put.bytes, 6 * plan.block_bytes());
  int shards_used = 0;
  for (const auto& s : shards_) {
    shards_used += std::any_of(blocks.begin(), blocks.end(), [&](const BlockData& b) {
      return pool.ShardOf(b.hash) == s->address;
    });
  }
  EXPECT_EQ(put.ahead, shards_used);
  EXPECT_EQ(ShmReserved(), 6);  // no second Reserve: the put was the Commit alone
  EXPECT_EQ(ShmCommitted(), 6);
  EXPECT_EQ(ShmOpenLeases(), 0);

  // Reserved again, the blocks are all there already: nothing to commit, no lease held.
  auto again = pool.Reserve(Sizes(blocks));
  EXPECT_EQ(again->reserved_bytes(), 0);
  const StorePool::PutReport second = pool.Put(blocks, again.get());
  EXPECT_EQ(second.stored, std::vector<bool>(6, true));
  EXPECT_EQ(second.uploaded, 0);
  EXPECT_EQ(ShmCommitted(), 6);

  engine::ImportStats stats;
  int cached = -1;
  const auto rest = Decode(pool, first, &stats, &cached);
  EXPECT_EQ(first, expected[0]);
  EXPECT_EQ(stats.hits, 6);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));
}

// Two requests sharing a prompt prefix, both reserving ahead: the first to reserve (A) holds
// the prefix's space while it computes; the second (B) is left those blocks. If B finishes
// first, its put still stores them (the shard gives B space of its own) before it reports them
// stored, so decode hits at once instead of finding a prefix still being written; A's later
// commit frees its copy. If A finishes first, B's put finds them stored and sends nothing.
TEST_F(StorePoolTest, APrefixReservedAheadByAnotherRequestIsStoredByWhoeverFinishesFirst) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, prompt_, 8, 0);
  StorePool pool({shards_[0]->address}, "tiny");  // one shard: both reserve on it
  auto [first, blocks] = Prefill(pool);
  const int64_t block_bytes = std::ssize(blocks[0].bytes);

  auto a = pool.Reserve(Sizes(blocks));
  EXPECT_EQ(a->reserved_bytes(), 6 * block_bytes);
  auto b = pool.Reserve(Sizes(blocks));
  EXPECT_EQ(b->reserved_bytes(), 0);  // all being written by A
  const StorePool::PutReport put_b = pool.Put(blocks, b.get());
  EXPECT_EQ(put_b.stored, std::vector<bool>(6, true));
  EXPECT_EQ(put_b.uploaded, 6);

  engine::ImportStats stats;
  int cached = -1;
  const auto rest = Decode(pool, first, &stats, &cached);  // A still holds its reservation
  EXPECT_EQ(stats.hits, 6);
  EXPECT_EQ(cached, 96);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));

  const StorePool::PutReport put_a = pool.Put(blocks, a.get());
  EXPECT_EQ(put_a.stored, std::vector<bool>(6, true));
  EXPECT_EQ(put_a.ahead, 1);
  cache_store::BlockStoreStats s = shards_[0]->store->Stats();
  EXPECT_EQ(s.duplicate_puts, 6);
  EXPECT_EQ(s.blocks, 6);
  EXPECT_EQ(s.used_bytes, 6 * block_bytes);
  EXPECT_EQ(s.pending_puts, 0);
  // The decode's get releases its lease with an RPC it does not wait for (ArenaClient::Release).
  EXPECT_TRUE(testing::Eventually([&] { return ShmOpenLeases() == 0; }));

  // The other order, on a fresh shard: A finishes first, and B's put finds the prefix stored.
  shards_[0]->server->Shutdown();
  shards_[0] = StartShard();
  StorePool fresh({shards_[0]->address}, "tiny");
  a = fresh.Reserve(Sizes(blocks));
  b = fresh.Reserve(Sizes(blocks));
  EXPECT_EQ(b->reserved_bytes(), 0);
  EXPECT_EQ(fresh.Put(blocks, a.get()).uploaded, 6);
  const StorePool::PutReport late_b = fresh.Put(blocks, b.get());
  EXPECT_EQ(late_b.stored, std::vector<bool>(6, true));
  EXPECT_EQ(late_b.uploaded, 0);
  s = shards_[0]->store->Stats();
  EXPECT_EQ(s.duplicate_puts, 0);
  EXPECT_EQ(s.puts, 6);
}

// A reservation that does not fit the put (fewer blocks than reserved: the engine's prefix cache
// lost some), or has grown too old, is released, and the put goes the usual way.
TEST_F(StorePoolTest, AReservationThatDoesNotFitIsReleasedAndThePutStillStores) {
  // One shard: with two, the blocks put might by chance be exactly one shard's reserved ones.
  StorePool pool({shards_[0]->address}, "tiny");
  auto [first, blocks] = Prefill(pool);
  std::unique_ptr<StorePool::Reservation> reservation = pool.Reserve(Sizes(blocks));
  EXPECT_GT(ShmOpenLeases(), 0);
  const std::vector<BlockData> fewer(blocks.begin(), blocks.begin() + 3);
  const StorePool::PutReport put = pool.Put(fewer, reservation.get());
  EXPECT_EQ(put.stored, std::vector<bool>(3, true));
  EXPECT_EQ(put.ahead, 0);
  EXPECT_EQ(ShmCommitted(), 3);
  EXPECT_TRUE(testing::Eventually([&] { return ShmOpenLeases() == 0; }));

  // Unused, it is released when destroyed.
  auto unused = pool.Reserve(Sizes(blocks));
  EXPECT_GT(ShmOpenLeases(), 0);
  unused.reset();
  EXPECT_TRUE(testing::Eventually([&] { return ShmOpenLeases() == 0; }));
}

TEST_F(StorePoolTest, AReservationPastItsLeaseIsNotWrittenInto) {
  // Short enough to wait out; long enough for the fallback put to finish within half of it
  // under the sanitizers.
  cache_store::ShmHandoffOptions short_leases;
  short_leases.leases.ttl = std::chrono::milliseconds(600);
  shards_[0]->server->Shutdown();
  shards_[0] = StartShard(short_leases);
  StorePool pool({shards_[0]->address}, "tiny");
  auto [first, blocks] = Prefill(pool);
  std::unique_ptr<StorePool::Reservation> reservation = pool.Reserve(Sizes(blocks));
  ASSERT_EQ(reservation->reserved_bytes(), Sizes(blocks).size() * Sizes(blocks)[0].bytes);
  ASSERT_TRUE(
      testing::Eventually([&] { return shards_[0]->service->shm().Stats().expired_leases == 1; }));
  const StorePool::PutReport put = pool.Put(blocks, reservation.get());
  EXPECT_EQ(put.stored, std::vector<bool>(6, true));
  EXPECT_EQ(put.ahead, 0);  // reserved again by the usual put
  EXPECT_EQ(shards_[0]->service->shm().Stats().reserved_blocks, 12);
  EXPECT_EQ(shards_[0]->service->shm().Stats().committed_blocks, 6);
}

TEST_F(StorePoolTest, HandoffIsExactOverTheStreamToo) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, prompt_, 8, 0);
  StorePool pool({shards_[0]->address, shards_[1]->address}, "tiny", {.shared_memory = false});
  auto [first, blocks] = Prefill(pool);
  EXPECT_EQ(pool.Put(blocks).uploaded, 6);
  engine::ImportStats stats;
  int cached = -1;
  const auto rest = Decode(pool, first, &stats, &cached);
  EXPECT_EQ(stats.hits, 6);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));
  EXPECT_EQ(ShmCommitted(), 0);
  EXPECT_EQ(ShmAcquired(), 0);
}

TEST_F(StorePoolTest, ADeadShardTurnsItsBlocksIntoMisses) {
  auto whole = MakeEngine();
  const std::vector<int32_t> expected = Run(*whole, prompt_, 8, 0);
  StorePool pool({shards_[0]->address, shards_[1]->address}, "tiny",
                 {.timeout = std::chrono::seconds(2)});
  auto [first, blocks] = Prefill(pool);
  ASSERT_EQ(pool.Put(blocks).uploaded, 6);
  // The shard holding the first block goes away: the usable prefix is empty.
  const std::string dead = pool.ShardOf(blocks[0].hash);
  for (auto& s : shards_) {
    if (s->address == dead) {
      s->server->Shutdown();
      s->server.reset();
    }
  }
  engine::ImportStats stats;
  int cached = -1;
  const auto rest = Decode(pool, first, &stats, &cached);
  EXPECT_EQ(stats.hits, 0);
  EXPECT_EQ(stats.misses, 6);
  EXPECT_EQ(cached, 0);
  EXPECT_EQ(rest, std::vector<int32_t>(expected.begin() + 1, expected.end()));
  // Uploading with a shard down stores what the live shard owns.
  StorePool::PutReport put = pool.Put(blocks);
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(put.stored[i], pool.ShardOf(blocks[i].hash) != dead) << i;
  }
}

}  // namespace
}  // namespace tandem::store
