// The cache store as a worker sees it: every shard, block keys placed by consistent hashing
// (ShardRing). A shard that fails does not fail the request: its blocks count as not stored
// (prefill) or absent (decode), and decode recomputes them (DESIGN.md, "Failures").
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/security/transport.h"
#include "common/store/cache_store_client.h"
#include "common/store/shard_ring.h"

namespace tandem::store {

struct StorePoolOptions {
  int64_t chunk_bytes = 1 << 20;
  std::chrono::milliseconds timeout = std::chrono::seconds(10);
  // Move blocks through shared memory with shards on this machine that offer it
  // (cache_store.shared_memory); other shards, and any that refuse, are streamed to.
  bool shared_memory = true;
  std::shared_ptr<const security::Transport> transport = security::Transport::Insecure();
};

class StorePool {
 public:
  StorePool(std::vector<std::string> shard_addresses, std::string model_id,
            const StorePoolOptions& options = {});

  bool empty() const { return ring_.empty(); }
  const std::string& ShardOf(uint64_t hash) const { return ring_.shards()[ring_.ShardFor(hash)]; }

  struct PutReport {
    std::vector<bool> stored;  // per block: now held by its shard (newly or already)
    int uploaded = 0;          // blocks whose bytes were sent
    int64_t bytes = 0;
  };
  // Sends each block to its shard unless the shard already holds it.
  PutReport Put(std::span<const BlockData> blocks);
  // One entry per hash; nullopt when the block is absent or its shard failed.
  std::vector<std::optional<std::string>> Get(std::span<const uint64_t> hashes);

 private:
  ShardRing ring_;
  std::vector<std::unique_ptr<CacheStoreClient>> clients_;  // per ring_.shards() index
};

}  // namespace tandem::store
