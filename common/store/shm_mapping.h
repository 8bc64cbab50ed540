// A client's mapping of a cache-store shard's shared-memory arena (cache_store/shm_arena.h).
// The shard is not trusted with the client's memory: the file must be size-sealed (so it cannot
// shrink under the mapping and fault), its header must name the shard instance attached to, and
// every offset and size the shard hands out is checked against the mapping before a byte is
// touched.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::store {

// OK when [offset, offset + size) is non-empty and lies in the block area of a mapping of
// `mapped_bytes` (after the header page); InvalidArgument otherwise, overflow included.
absl::Status ValidateShmRegion(int64_t offset, int64_t size, int64_t mapped_bytes);

// Whether the gRPC target `address` is on this machine: a loopback address, a unix socket, this
// host's name or one of its interface addresses. Only such shards are offered the shared-memory
// path (and attaching proves it: the arena's header must name the shard).
bool IsLocalAddress(std::string_view address);

class ShmMapping {
 public:
  // Opens `path` (under /proc/ or /dev/shm/) read-write and maps its first `file_bytes` shared.
  // FailedPrecondition for another path, or if the file is not size-sealed, is smaller, or its
  // header does not name `instance_id`.
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Open(const std::string& path,
                                                          int64_t file_bytes, uint64_t instance_id);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  uint64_t instance_id() const { return instance_id_; }
  int64_t size() const { return size_; }
  // The bytes at [offset, offset + size) of the file; ValidateShmRegion's errors.
  absl::StatusOr<std::span<uint8_t>> Region(int64_t offset, int64_t size) const;

 private:
  ShmMapping(uint8_t* base, int64_t size, uint64_t instance_id)
      : base_(base), size_(size), instance_id_(instance_id) {}

  uint8_t* const base_;
  const int64_t size_;
  const uint64_t instance_id_;
};

}  // namespace tandem::store
