// Where a BlockStore keeps block bytes: private heap memory, or a shared-memory arena that
// co-located clients map (the node-local fast path). The store enforces its capacity in bytes
// either way; an arena can additionally run out of contiguous room, and then the store evicts
// more before retrying.
//
// Not thread-safe: the store calls it under its mutex.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "cache_store/shm_arena.h"

namespace tandem::cache_store {

class BlockMemory {
 public:
  virtual ~BlockMemory() = default;
  // `size` (> 0) writable bytes, or nullptr when no contiguous range of that size is free.
  virtual uint8_t* Allocate(int64_t size) = 0;
  // Returns bytes Allocate gave out, with the size they were asked for.
  virtual void Free(uint8_t* data, int64_t size) = 0;
  // The shared arena the bytes live in; nullptr for private memory.
  virtual const ShmArena* arena() const { return nullptr; }
};

std::unique_ptr<BlockMemory> NewHeapBlockMemory();
// An arena of `capacity_bytes`, every page allocated now if `preallocate`; the ShmArena::Create
// errors.
absl::StatusOr<std::unique_ptr<BlockMemory>> NewSharedBlockMemory(int64_t capacity_bytes,
                                                                  bool preallocate = false);

}  // namespace tandem::cache_store
