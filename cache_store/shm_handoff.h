// The shard's half of the node-local fast path: co-located clients map the store's arena
// (BlockStore::arena()) and copy block bytes themselves; this hands out offsets under leases
// (shm_leases.h). Writes: Reserve gives offsets of PendingPuts, the client copies in, Commit
// checks each block's XXH3-64 and publishes it. Reads: Acquire pins blocks and gives offsets and
// checksums, the client copies out and verifies, Release unpins.
//
// Thread-safe. The store must outlive it. Errors are absl statuses; the service maps them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache_store/block_store.h"
#include "cache_store/shm_leases.h"
#include "common/fabric/kv_protocol.h"
#include "tandem/v1/cache_store.pb.h"

namespace tandem::cache_store {

struct ShmHandoffOptions {
  ShmLeaseOptions leases;
  int max_blocks_per_call = 1 << 16;  // more is InvalidArgument
  // Re-hash every block at Commit and refuse those that do not match the writer's XXH3-64.
  // Off by default: every reader already checks that checksum — a shared-memory reader in the
  // copy it makes anyway, the shard before it vouches for a block with a stream checksum — so
  // a bad block never reaches an engine either way, and the extra pass costs about a third of
  // a put.
  bool verify_commits = false;
  // Hand the arena to co-located clients (AttachSharedMemory). Off (cache_store.shared_memory:
  // false, as on Kubernetes, where pods cannot map each other's memory) the arena and its leases
  // serve the KV fabric alone.
  bool offer_shared_memory = true;
};

// Counters since creation.
struct ShmHandoffStats {
  int64_t reserved_blocks = 0;   // space handed out by Reserve
  int64_t committed_blocks = 0;  // made visible by Commit
  int64_t acquired_blocks = 0;   // pinned by Acquire
  int64_t open_leases = 0;       // now
  int64_t expired_leases = 0;    // ended by expiry, not by their client
};

class ShmHandoff {
 public:
  ShmHandoff(BlockStore& store, const ShmHandoffOptions& options);

  // FailedPrecondition when the store keeps its blocks in private memory.
  absl::Status Attach(tandem::v1::AttachSharedMemoryResponse* response) const;
  // `peer`: the client's connection (grpc's peer()); a lease is committed or released only by
  // the connection that took it.
  absl::Status Reserve(const tandem::v1::ReserveShmRequest& request,
                       tandem::v1::ReserveShmResponse* response, const std::string& peer = "");
  absl::Status Commit(const tandem::v1::CommitShmRequest& request,
                      tandem::v1::CommitShmResponse* response, const std::string& peer = "");
  absl::Status Acquire(const tandem::v1::AcquireShmRequest& request,
                       tandem::v1::AcquireShmResponse* response, const std::string& peer = "");
  // Acquire, with the blocks on disk only read back on the store's promote threads
  // (BlockStore::PromoteThen): `done` gets the answer there, or at once when nothing is read.
  // `request` and `response` must live until then.
  void Acquire(const tandem::v1::AcquireShmRequest& request,
               tandem::v1::AcquireShmResponse* response, std::string peer,
               std::function<void(const absl::Status&)> done);
  absl::Status Release(const tandem::v1::ReleaseShmRequest& request, const std::string& peer = "");

  // One fabric message's hold on blocks of a keyed lease (ShmLeases::Borrow): the arena bytes
  // of the lease's blocks `blocks` names, each only if its offset (in the arena file) and length
  // name exactly the block at its index. All or none: keep `lease` until the transfer ends.
  // PermissionDenied for a wrong id, key or kind; InvalidArgument for a region that is not its
  // block's.
  struct Borrowed {
    std::shared_ptr<const ShmLeases::Lease> lease;
    std::vector<std::span<uint8_t>> blocks;  // in the order `blocks` named them
  };
  absl::StatusOr<Borrowed> BorrowBlocks(uint64_t lease_id, const ShmLeases::Key& key, bool write,
                                        std::span<const fabric::KvBlockRef> blocks);
  // The arena, for the fabric to register; nullptr without one.
  const ShmArena* arena() const { return arena_; }
  std::chrono::milliseconds lease_time() const { return leases_.ttl(); }

  ShmHandoffStats Stats() const;

 private:
  // FailedPrecondition without an arena or for another shard instance's id.
  absl::Status CheckInstance(uint64_t instance_id) const;
  absl::Status CheckCount(int n) const;
  // Acquire's pins and lease, once the blocks `from_disk` says were read back are in memory.
  absl::Status Pin(const tandem::v1::AcquireShmRequest& request, const std::vector<bool>& from_disk,
                   tandem::v1::AcquireShmResponse* response, const std::string& peer);

  BlockStore& store_;
  const ShmArena* const arena_;
  const ShmHandoffOptions options_;
  std::atomic<int64_t> reserved_blocks_{0};
  std::atomic<int64_t> committed_blocks_{0};
  std::atomic<int64_t> acquired_blocks_{0};
  ShmLeases leases_;
};

}  // namespace tandem::cache_store
