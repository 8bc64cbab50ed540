// The prefix index's change log (TensorRT-LLM's KV cache event manager, Dynamo's KV events):
// every block hash that enters the index (stored) or leaves it (removed), numbered in order.
// A mirror of the index (the router's view of a worker) applies the events after the last one
// it has, and resyncs from a full snapshot when the log no longer reaches back that far.
//
// Not thread-safe: owned by KvCacheManager, on the engine-loop thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/kv/block_hash.h"

namespace tandem::kv {

struct KvEvent {
  uint64_t seq = 0;
  BlockHash hash = 0;
  bool removed = false;  // false: stored
};

class KvEventLog {
 public:
  // Keeps the last `capacity` events; older ones are dropped (a mirror that far behind resyncs).
  explicit KvEventLog(size_t capacity = size_t{1} << 16) : capacity_(capacity) {}

  void Stored(BlockHash hash) { Append(hash, false); }
  void Removed(BlockHash hash) { Append(hash, true); }

  // The number the next event will get: a snapshot of the index taken now is current up to
  // (excluding) this event.
  uint64_t next_seq() const { return next_seq_; }
  // Appends the events numbered `from` and later to `*out`. False (nothing appended) when some
  // of them were already dropped: the caller needs a full snapshot.
  bool Since(uint64_t from, std::vector<KvEvent>* out) const;

 private:
  void Append(BlockHash hash, bool removed);

  const size_t capacity_;
  std::deque<KvEvent> events_;  // the newest, consecutive seqs
  uint64_t next_seq_ = 0;
};

}  // namespace tandem::kv
