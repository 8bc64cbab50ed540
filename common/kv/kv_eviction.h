// Eviction policies for long sequences (kv_cache.eviction): the attention-sink tokens and a recent
// budget stay, older blocks are evicted (KvCacheManager::EvictBlocks).
//  - sliding: the oldest blocks past the sinks, exactly as many as the budget needs
//    (StreamingLLM).
//  - semantic: the seed's elastic window. The cache is cut into chunks; a topic shift starts a
//    new segment where the cosine distance between the mean keys of consecutive chunks stands
//    out: above the sequence's running mean of those distances by shift_threshold standard
//    deviations (cached keys carry RoPE, so the raw distance has a model-dependent floor).
//    Eviction goes up to the first segment start that frees enough, so what stays begins where
//    a topic begins; with no such start within reach it falls back to sliding.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kv/kv_cache_manager.h"

namespace tandem::kv {

struct EvictionPolicy {
  int budget_tokens = 0;  // 0: off
  int sink_tokens = 4;
  bool semantic = false;
  double shift_threshold = 1.5;  // standard deviations above the mean chunk-to-chunk distance
  int chunk_tokens = 64;         // rounded to whole blocks
};

// One sequence's eviction state. Not thread-safe: the engine loop owns it with the sequence.
class SequenceEviction {
 public:
  explicit SequenceEviction(const EvictionPolicy& policy) : policy_(policy) {}

  // Call after tokens [0, num_computed) of `seq_id` are committed. Evicts what the policy drops
  // and returns how many blocks that was.
  int Apply(KvCacheManager& kv, int64_t seq_id, int num_computed);

  // Block indices where a segment starts (semantic policy), in order; for tests and tools.
  const std::vector<int>& segment_starts() const { return segment_starts_; }

 private:
  // Mean key of the chunk of blocks [first, first + count) in the middle layer (every KV head),
  // read from the cache.
  std::vector<float> ChunkMeanKey(const KvCacheManager& kv, const std::vector<int32_t>& table,
                                  int first, int count) const;
  void DetectShifts(const KvCacheManager& kv, const std::vector<int32_t>& table, int full_blocks);

  EvictionPolicy policy_;
  int evicted_to_ = 0;  // blocks before this one, past the sinks, are evicted
  std::vector<float> last_mean_;
  int chunks_seen_ = 0;
  // Running mean and sum of squared deviations of the chunk-to-chunk distances (Welford).
  int64_t distances_ = 0;
  double distance_mean_ = 0, distance_m2_ = 0;
  std::vector<int> segment_starts_;
};

}  // namespace tandem::kv
