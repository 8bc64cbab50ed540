// The cache store as a worker sees it: every shard, block keys placed by consistent hashing
// (ShardRing). A shard that fails does not fail the request: its blocks count as not stored
// (prefill) or absent (decode), and decode recomputes them (DESIGN.md, "Failures").
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/security/transport.h"
#include "common/store/cache_store_client.h"
#include "common/store/shard_ring.h"

namespace tandem::store {

// Which shards a worker tries the KV fabric (UCX) with, after shared memory and before the
// stream (cache_store.transport: auto uses it for shards on other machines, ucx for every shard).
enum class FabricUse { kNever, kRemoteShards, kEveryShard };

struct StorePoolOptions {
  int64_t chunk_bytes = 1 << 20;
  std::chrono::milliseconds timeout = std::chrono::seconds(10);
  // Move blocks through shared memory with shards on this machine that offer it
  // (cache_store.shared_memory); other shards, and any that refuse, are streamed to.
  bool shared_memory = true;
  // Then the KV fabric (UCX) with these of the shards that offer it.
  FabricUse fabric = FabricUse::kNever;
  std::shared_ptr<const security::Transport> transport = security::Transport::Insecure();
  // Told of every transfer with a shard (CacheStoreClientOptions::on_transfer).
  std::function<void(const TransferSample&)> on_transfer = nullptr;
};

class StorePool {
 public:
  StorePool(std::vector<std::string> shard_addresses, std::string model_id,
            const StorePoolOptions& options = {});
  // Waits for ConnectInBackground's thread (a few seconds at most).
  ~StorePool();
  StorePool(const StorePool&) = delete;
  StorePool& operator=(const StorePool&) = delete;

  // Readies each shard's first transfer (CacheStoreClient::Connect: the connection, the
  // shared-memory or fabric path attached) on a thread of its own, so that a worker starting
  // waits for no shard and its first request pays none of it. Once: later calls do nothing.
  void ConnectInBackground();

  bool empty() const { return ring_.empty(); }
  const std::string& ShardOf(uint64_t hash) const { return ring_.shards()[ring_.ShardFor(hash)]; }

  struct PutReport {
    std::vector<bool> stored;  // per block: now held by its shard (newly or already)
    int uploaded = 0;          // blocks whose bytes were sent
    int64_t bytes = 0;
    int ahead = 0;  // shards put through the reservation (one round trip each)
  };
  // Space in the shards for blocks whose bytes come later, where the shared-memory path is
  // available (ArenaClient::Reserve); released unused when destroyed. Must not outlive the pool.
  class Reservation {
   public:
    int64_t reserved_bytes() const;  // bytes the shards made room for

   private:
    friend class StorePool;
    std::vector<std::unique_ptr<ArenaClient::Reservation>> by_shard_;  // per ring_.shards() index
  };
  // Reserves space for `blocks` (their hashes and sizes, in the order Put will get them) on
  // each shard that takes shared memory: a later Put of exactly those blocks then costs one round
  // trip per shard. A prefill worker reserves while its engine computes the blocks.
  std::unique_ptr<Reservation> Reserve(std::span<const BlockSize> blocks);
  // Sends each block to its shard unless the shard already holds it; through `reservation`
  // where it fits the blocks.
  PutReport Put(std::span<const BlockData> blocks, Reservation* reservation = nullptr);
  // One entry per hash; nullopt when the block is absent or its shard failed. With `tiers`, also
  // the tier of its shard each block was found in (kNone where absent).
  std::vector<std::optional<std::string>> Get(std::span<const uint64_t> hashes,
                                              std::vector<StoreTier>* tiers = nullptr);

 private:
  // The indices [0, n) by the shard of hash(i), per ring_.shards() index.
  std::vector<std::vector<size_t>> ByShard(size_t n, const std::function<uint64_t(size_t)>& hash);

  ShardRing ring_;
  std::vector<std::unique_ptr<CacheStoreClient>> clients_;  // per ring_.shards() index
  std::thread connector_;
};

}  // namespace tandem::store
