// What workers hand the cache store and get back: whole blocks keyed by their chained hash.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::store {

struct BlockData {
  uint64_t hash = 0;
  std::string bytes;
};

struct PutResult {
  int stored = 0;
  int skipped = 0;  // already held by the shard
};

}  // namespace tandem::store
