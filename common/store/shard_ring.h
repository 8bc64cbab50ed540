// Consistent hashing of KV block keys onto cache-store shards: each shard owns many points on a
// 64-bit ring, a block goes to the first point at or after its hash. Adding or removing a shard
// moves only the blocks that shard gains or loses (about 1/n of them).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::store {

class ShardRing {
 public:
  // `shards` are addresses (any distinct strings); `points_per_shard` trades balance for size.
  explicit ShardRing(std::vector<std::string> shards, int points_per_shard = 128);

  bool empty() const { return shards_.empty(); }
  const std::vector<std::string>& shards() const { return shards_; }
  // Index into shards() of the shard that owns `block_hash`. The ring must not be empty.
  int ShardFor(uint64_t block_hash) const;

 private:
  std::vector<std::string> shards_;
  std::vector<std::pair<uint64_t, int>> points_;  // (ring position, shard index), sorted
};

}  // namespace tandem::store
