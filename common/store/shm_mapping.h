// A client's mapping of a cache-store shard's shared-memory arena (cache_store/shm_arena.h).
// The shard is not trusted with the client's memory: the file must be size-sealed (so it cannot
// shrink under the mapping and fault), its header must name the shard instance attached to, and
// every offset and size the shard hands out is checked against the mapping before a byte is
// touched.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "common/store/arena_path.h"

namespace tandem::store {

// OK when [offset, offset + size) is non-empty and lies in the block area of a mapping of
// `mapped_bytes` (after the header page); InvalidArgument otherwise, overflow included.
absl::Status ValidateShmRegion(int64_t offset, int64_t size, int64_t mapped_bytes);

// Whether the gRPC target `address` is on this machine: a loopback address, a unix socket, this
// host's name or one of its interface addresses. Only such shards are offered the shared-memory
// path (and attaching proves it: the arena's header must name the shard).
bool IsLocalAddress(std::string_view address);

// The shared-memory ArenaPath: block bytes are copied straight between the caller's buffers and
// the mapped arena, one pass each way with the XXH3-64 fused into the copy.
class ShmMapping final : public ArenaPath {
 public:
  // Opens `path` (under /proc/ or /dev/shm/) read-write and maps its first `file_bytes` shared.
  // FailedPrecondition for another path, or if the file is not size-sealed, is smaller, or its
  // header does not name `instance_id`.
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Open(const std::string& path,
                                                          int64_t file_bytes, uint64_t instance_id);
  ~ShmMapping() override;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  uint64_t instance_id() const override { return instance_id_; }
  int64_t size() const override { return size_; }
  bool keyed() const override { return false; }
  absl::Status CheckRegion(int64_t offset, int64_t length) const override {
    return ValidateShmRegion(offset, length, size_);
  }
  // The lease is not needed: the mapping reaches the regions directly.
  absl::StatusOr<std::vector<uint64_t>> Write(const LeaseGrant& lease,
                                              std::span<const ArenaRegion> regions) override;
  absl::StatusOr<std::vector<uint64_t>> Read(const LeaseGrant& lease,
                                             std::span<const ArenaRegion> regions,
                                             std::span<std::string> out) override;
  // The bytes at [offset, offset + size) of the file; ValidateShmRegion's errors.
  absl::StatusOr<std::span<uint8_t>> Region(int64_t offset, int64_t size) const;

  // Maps the whole arena on a thread of its own (PopulateWritable), for a shard that allocated all
  // of it at startup (cache_store.preallocate): this process's first write to each block then
  // costs no page fault. The destructor stops it. Once only; logs what it did.
  void PopulateInBackground();
  // Whether PopulateInBackground mapped the whole arena.
  bool populated() const { return populated_.load(std::memory_order_acquire); }

 private:
  ShmMapping(uint8_t* base, int64_t size, uint64_t instance_id)
      : base_(base), size_(size), instance_id_(instance_id) {}

  uint8_t* const base_;
  const int64_t size_;
  const uint64_t instance_id_;
  std::atomic<bool> stop_populating_{false};
  std::atomic<bool> populated_{false};
  std::thread populator_;
};

}  // namespace tandem::store
