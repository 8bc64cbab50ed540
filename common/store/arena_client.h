// The client's half of the lease protocol with one shard (cache_store/shm_handoff.h): the RPCs
// reserve, commit, pin and release regions of the shard's arena, and an ArenaPath
// (arena_path.h) moves the block bytes, by shared memory on the shard's machine (the bytes are
// copied through a path) or over the KV fabric (UCX) from anywhere.
//
// Attaches at Connect (a worker starting) or on first use. When the shard does not offer the path,
// or it cannot be reached, or the shard restarted (FAILED_PRECONDITION), the calls answer nullopt
// and the caller streams instead; a failed attach is retried after a pause. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/store/arena_path.h"
#include "common/store/block_data.h"
#include "tandem/v1/cache_store.grpc.pb.h"

namespace tandem::store {

// The tier a shard reports for a block it found; a shard that does not say held it in memory.
StoreTier FromProto(tandem::v1::StoreTier tier);

enum class ArenaTransport { kSharedMemory, kFabric };
const char* ArenaTransportName(ArenaTransport transport);  // "shm", "ucx"

class ArenaClient {
 public:
  // The stub must outlive the client.
  ArenaClient(tandem::v1::CacheStore::StubInterface& stub, std::string model_id,
              std::chrono::milliseconds timeout,
              ArenaTransport transport = ArenaTransport::kSharedMemory,
              std::shared_ptr<class UcxKvClient> fabric_client = nullptr);
  // Waits for the lease releases still in flight.
  ~ArenaClient();

  // nullopt: the fast path is not available now; stream instead. Otherwise the outcome, as
  // CacheStoreClient::Put and Get define it.
  std::optional<absl::StatusOr<PutResult>> Put(std::span<const BlockData> blocks);
  std::optional<absl::StatusOr<std::vector<std::optional<std::string>>>> Get(
      std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers = nullptr);

  // Space for blocks reserved before their bytes exist, so that a put costs one round trip
  // (Commit) when they do. Destroying it unused releases the space. Must not outlive the client.
  class Reservation;
  // nullptr when the fast path is not available now or the blocks are more than one reservation
  // takes: the caller puts them the usual way later. Blocks the shard holds already are left out
  // (and count as skipped when put); so are blocks another writer is writing, and PutReserved
  // puts those of them that are still not stored then.
  std::unique_ptr<Reservation> Reserve(std::span<const BlockSize> blocks);
  // Copies `blocks` into the reservation's space and commits them, then puts those another writer
  // was writing at Reserve unless stored since (one more Reserve and Commit, only then). nullopt
  // when they are not the reserved blocks (other hashes or sizes), the reservation has grown too
  // old to use, or the fast path went away: the caller puts them the usual way. A reservation
  // serves one put.
  std::optional<absl::StatusOr<PutResult>> PutReserved(Reservation& reservation,
                                                       std::span<const BlockData> blocks);

  bool attached() const;
  ArenaTransport transport() const { return transport_; }
  // Attaches now where the path is available (a worker starting), so that the first transfer
  // finds it ready: the connection made, a preallocated arena already being mapped. A shard not
  // reachable yet is neither an error nor a pause: the first Put or Get tries again. Whether
  // the path is attached.
  bool Connect();

 private:
  using Clock = std::chrono::steady_clock;
  using Path = std::shared_ptr<ArenaPath>;

  // A batch's answer to ReserveShm: each block's region in the arena (length 0: the shard holds
  // the block already, or another writer is writing it) under one lease (id 0: none needed).
  struct Reserved {
    LeaseGrant lease;
    Clock::time_point sent;  // when the request left
    std::vector<ArenaRegion> regions;
    std::vector<size_t> pending;  // blocks left to another writer (requests `ahead` only)
    int skipped = 0;              // blocks not reserved, `pending` included
    int64_t bytes = 0;            // of the reserved regions
  };

  // nullptr when the path is unavailable. `eager`: Connect's, which neither warns nor delays
  // the next try when it fails.
  Path Attach(bool eager = false);
  absl::StatusOr<Path> AttachSharedMemory(std::chrono::milliseconds timeout);
  absl::StatusOr<Path> AttachFabric(std::chrono::milliseconds timeout);
  void Detach(const Path& path);
  // A failed call: detaches when the status says the arena is gone or changed, and turns
  // FAILED_PRECONDITION into nullopt, so the caller streams.
  template <typename T>
  std::optional<absl::StatusOr<T>> Failed(const Path& path, const absl::Status& status);

  // Reserves and commits `blocks`, or with `only` the blocks it indexes.
  absl::StatusOr<PutResult> PutBatch(ArenaPath& path, std::span<const BlockData> blocks,
                                     std::span<const size_t> only = {});
  // `ahead`: before the bytes exist; blocks another writer is writing are left to it.
  absl::StatusOr<Reserved> ReserveBatch(ArenaPath& path, std::span<const BlockSize> blocks,
                                        bool ahead = false);
  // Copies the blocks into `reserved`'s regions and commits them (one round trip). With `only`,
  // the reserved blocks are blocks[only[0]], blocks[only[1]], ...
  absl::StatusOr<PutResult> CommitBatch(ArenaPath& path, const Reserved& reserved,
                                        std::span<const BlockData> blocks,
                                        std::span<const size_t> only = {});
  absl::Status GetBatch(ArenaPath& path, std::span<const uint64_t> hashes,
                        std::span<std::optional<std::string>> out, std::span<StoreTier> tiers);
  // Ends a lease without waiting for the answer; if the call fails, the shard expires it.
  void Release(ArenaPath& path, uint64_t lease_id);
  // Ends a lease and waits for the answer.
  void ReleaseNow(ArenaPath& path, uint64_t lease_id);
  // A lease taken at `sent` is still certainly held: the shard ends none before its lease time,
  // counted from after `sent`, and half of it leaves room for clock and scheduling slack.
  bool LeaseHeld(Clock::time_point sent) const { return Clock::now() - sent <= lease_.load() / 2; }
  void SetDeadline(grpc::ClientContext& context) const { SetDeadline(context, timeout_); }
  static void SetDeadline(grpc::ClientContext& context, std::chrono::milliseconds timeout);

  tandem::v1::CacheStore::StubInterface& stub_;
  const std::string model_id_;
  const std::chrono::milliseconds timeout_;
  const ArenaTransport transport_;
  const std::shared_ptr<UcxKvClient> fabric_client_;  // null: UcxKvClient::Shared
  mutable absl::Mutex mu_;
  Path path_ ABSL_GUARDED_BY(mu_);
  Clock::time_point retry_after_ ABSL_GUARDED_BY(mu_);  // after a failed attach
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<std::chrono::milliseconds> lease_{};  // the shard's lease time, from Attach
  // Releases sent and not yet answered (their callbacks may outlive a call, not the client).
  absl::Mutex releases_mu_;
  int releases_in_flight_ ABSL_GUARDED_BY(releases_mu_) = 0;
};

class ArenaClient::Reservation {
 public:
  ~Reservation();
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  // Bytes of the blocks the shard made room for (not those it held already).
  int64_t reserved_bytes() const { return reserved_.bytes; }

 private:
  friend class ArenaClient;
  Reservation(ArenaClient& client, Path path, std::span<const BlockSize> blocks, Reserved reserved)
      : client_(client),
        path_(std::move(path)),
        blocks_(blocks.begin(), blocks.end()),
        reserved_(std::move(reserved)) {}
  // Ends the lease unless it was committed or released already.
  void Release();

  ArenaClient& client_;
  const Path path_;
  const std::vector<BlockSize> blocks_;
  Reserved reserved_;
  bool used_ = false;
};

}  // namespace tandem::store
