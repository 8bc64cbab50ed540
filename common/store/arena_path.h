// How a client reaches a cache-store shard's arena once the shard has handed out regions of it
// under a lease (arena_client.h): mapped into this process (shared memory, shm_mapping.h) or
// over the KV fabric (UCX, ucx_client.h). The lease protocol on gRPC is the same for both; only
// the way block bytes move differs. The shard is not trusted: every region it names is checked
// before a byte moves.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::store {

// What a lease lets its holder move: its id and, on the fabric, its key.
struct LeaseGrant {
  uint64_t id = 0;
  std::array<uint64_t, 2> key{};
};

// One block's region of a lease: its position among the lease's blocks, where it is in the
// arena file, and for a write the bytes to put there.
struct ArenaRegion {
  uint32_t index = 0;
  int64_t offset = 0;
  int64_t length = 0;
  std::span<const uint8_t> bytes;  // writes only; `length` of them
};

class ArenaPath {
 public:
  virtual ~ArenaPath() = default;
  // The shard instance the path leads to; every lease call carries it.
  virtual uint64_t instance_id() const = 0;
  // Bytes of the arena file: bounds how much one lease should hold.
  virtual int64_t size() const = 0;
  // Whether leases must be asked for with keys (`fabric` in the requests).
  virtual bool keyed() const = 0;
  // OK when [offset, offset + length) is a non-empty range of the arena's block area.
  virtual absl::Status CheckRegion(int64_t offset, int64_t length) const = 0;
  // Writes each region's bytes into it; their XXH3-64s, in order (for the commit).
  virtual absl::StatusOr<std::vector<uint64_t>> Write(const LeaseGrant& lease,
                                                      std::span<const ArenaRegion> regions) = 0;
  // Reads each region into `out` (one string per region, replaced); the XXH3-64 of what
  // arrived, in order, for the caller to compare with the shard's.
  virtual absl::StatusOr<std::vector<uint64_t>> Read(const LeaseGrant& lease,
                                                     std::span<const ArenaRegion> regions,
                                                     std::span<std::string> out) = 0;
  // Readies what the first transfer would otherwise set up (a connection), without waiting.
  virtual void Connect() {}
};

}  // namespace tandem::store
