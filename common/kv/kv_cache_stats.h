#pragma once

#include <cstdint>

namespace tandem::kv {

// Point-in-time snapshot of a KvCacheManager. Invariant:
// free_blocks + used_blocks + cached_blocks == total_blocks.
struct KvCacheStats {
  // Blocks in the pool (KvCacheOptions::num_blocks).
  int64_t total_blocks = 0;
  // Blocks holding nothing reusable: never used, or released without being in the prefix index.
  int64_t free_blocks = 0;
  // Blocks referenced by at least one sequence's block table (refcount > 0).
  int64_t used_blocks = 0;
  // Blocks with refcount 0 kept in the prefix cache; reusable by a prefix hit, evictable (LRU).
  int64_t cached_blocks = 0;
  // Prefix-cache block lookups that found a block, since creation.
  int64_t hits = 0;
  // Prefix-cache block lookups that found nothing (at most one per AddSequence), since creation.
  int64_t misses = 0;
  // Cached blocks reclaimed by allocation (LRU eviction), since creation. ResetPrefixCache does
  // not count.
  int64_t evictions = 0;
  // Int8 blocks of a mixed-precision cache (part of total_blocks; 0 for a uniform cache).
  int64_t narrow_blocks = 0;
  // Wide blocks requantized into int8 blocks as they fell behind the window, since creation.
  int64_t narrowed = 0;
  // Blocks dropped from sequences by a sliding or elastic window (EvictBlocks), since creation.
  int64_t window_evicted = 0;
  // Sequences currently registered.
  int64_t num_sequences = 0;
};

}  // namespace tandem::kv
