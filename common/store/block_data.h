// What workers hand the cache store and get back: whole blocks keyed by their chained hash.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::store {

struct BlockData {
  uint64_t hash = 0;
  std::string bytes;
};

// A block known by its hash and size before its bytes are (StorePool::Reserve).
struct BlockSize {
  uint64_t hash = 0;
  int64_t bytes = 0;
};

// Which tier of its shard a block a read found was in: kNone for a block not found.
enum class StoreTier : uint8_t { kNone, kMemory, kDisk };

struct PutResult {
  int stored = 0;
  int skipped = 0;     // already held by the shard
  int64_t bytes = 0;   // block bytes sent
  bool ahead = false;  // through a reservation made ahead (one round trip)
};

}  // namespace tandem::store
