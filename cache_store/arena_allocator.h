// Offsets inside a fixed-size arena: best-fit allocation of aligned ranges (64 bytes for memory,
// a page for the disk tier) from a free list that coalesces neighbours on free. Blocks of one model
// all have one size, so holes left by evicted blocks are reused exactly and fragmentation stays
// low.
//
// Not thread-safe: BlockStore calls it under its own mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace tandem::cache_store {

class ArenaAllocator {
 public:
  static constexpr int64_t kAlignment = 64;  // a cache line: copies into blocks start aligned

  // `alignment`: a power of two; ranges start and are sized in multiples of it.
  explicit ArenaAllocator(int64_t size, int64_t alignment = kAlignment);

  // The offset of `size` free bytes (rounded up to kAlignment), or nullopt when no free range
  // is large enough. `size` must be positive.
  std::optional<int64_t> Allocate(int64_t size);
  // Takes the range at `offset` (aligned) if all of it is free; false otherwise. For rebuilding
  // the allocation of blocks found on disk after a restart.
  bool AllocateAt(int64_t offset, int64_t size);
  // Returns a range Allocate gave out, with the size it was asked for.
  void Free(int64_t offset, int64_t size);

  int64_t size() const { return size_; }
  int64_t free_bytes() const { return free_bytes_; }
  int64_t largest_free_range() const;

 private:
  int64_t Rounded(int64_t size) const { return (size + alignment_ - 1) / alignment_ * alignment_; }
  void AddFree(int64_t offset, int64_t length);
  void RemoveFree(std::map<int64_t, int64_t>::iterator it);

  const int64_t alignment_;
  const int64_t size_;
  int64_t free_bytes_;
  std::map<int64_t, int64_t> by_offset_;             // free ranges: offset -> length
  std::set<std::pair<int64_t, int64_t>> by_length_;  // the same ranges as (length, offset)
};

}  // namespace tandem::cache_store
