// The worker's half of the KV fabric (common/fabric/kv_protocol.h): one UCX worker per process
// (UcxKvClient::Shared) that moves blocks to and from shards' arenas, a run of blocks per active
// message (up to kMessageBytes), all of a call's messages in flight at once;
// and UcxArenaPath, the ArenaPath (arena_path.h) over it, so that the lease protocol of
// arena_client.h runs unchanged on the fabric.
//
// Failures stay cheap: a call that fails or passes its deadline is an error the caller treats
// as a miss (or streams instead); its endpoint is closed and the next use builds a new one.
// An endpoint is also closed when the last UcxArenaPath to its shard goes (the shard restarted
// and was attached again at its new address, say): over shared memory UCX cannot tell that a
// peer died, and its endpoint would keep the dead peer's memory mapped.
// Put bytes are sent from the caller's buffers; a call returns only once UCX no longer reads
// them, so a late or failed send never touches freed memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/fabric/ucx_worker.h"
#include "common/store/arena_path.h"

namespace tandem::store {

// Counters since the process started.
struct UcxKvClientStats {
  int64_t put_blocks = 0;
  int64_t get_blocks = 0;
  int64_t put_bytes = 0;
  int64_t get_bytes = 0;
  int64_t failed_batches = 0;  // refused, lost or late
  int64_t endpoints = 0;       // open now, one per shard worker in use
  int64_t endpoints_created = 0;  // since the client started
};

class UcxKvClient {
 public:
  using Clock = std::chrono::steady_clock;
  // A message carries blocks until this many bytes (at least one block, at most
  // fabric::kKvMaxBlocksPerMessage): small blocks share one rendezvous instead of paying one
  // each, a block this large or larger moves alone with no copy, and a get's checksums start
  // on the first message while the next ones move. Several blocks travel packed back to back
  // (docs/benchmarks.md: UCX 1.13 sends an iovec through slow fragmenting protocols).
  static constexpr int64_t kMessageBytes = int64_t{1} << 20;

  // The process's client, started on first use; Unavailable when UCX cannot start.
  static absl::StatusOr<std::shared_ptr<UcxKvClient>> Shared();
  // A client of its own on `transports` (UcxWorkerOptions::transports), for comparing them in
  // one process (kv-handoff-bench).
  static absl::StatusOr<std::shared_ptr<UcxKvClient>> Create(const std::string& transports);
  ~UcxKvClient();

  // Moves every region (see ArenaPath::Write and Read) to or from the shard whose worker is at
  // `address`. OK only when all arrived by `deadline`. The shard's refusal comes back as its
  // status (PermissionDenied for a wrong key or an ended lease); a lost peer or the deadline is
  // Unavailable or DeadlineExceeded.
  // `meanwhile`, if given, runs on the calling thread while the bytes move (the checksums).
  absl::Status Write(const std::string& address, const LeaseGrant& lease,
                     std::span<const ArenaRegion> regions, Clock::time_point deadline,
                     const std::function<void()>& meanwhile = nullptr);
  // Reads into `out`, one string per region, resized to its length. `arrived`, if given, runs
  // on the calling thread as each message's blocks are in: with the first region's position
  // and those blocks (the checksums, while later messages still move).
  using Arrived = std::function<void(size_t first, std::span<const std::string> blocks)>;
  absl::Status Read(const std::string& address, const LeaseGrant& lease,
                    std::span<const ArenaRegion> regions, std::span<std::string> out,
                    Clock::time_point deadline, const Arrived& arrived = nullptr);

  // Blocks one message names at most: fabric::kKvMaxBlocksPerMessage, or fewer where the
  // transports' largest active-message header is smaller.
  size_t blocks_per_message() const { return blocks_per_message_; }
  UcxKvClientStats Stats() const;

  // A UcxArenaPath to the shard at `address` begins and ends: when the last of them ends, the
  // endpoint to it is closed. Thread-safe.
  void AddPath(const std::string& address);
  void RemovePath(const std::string& address);
  // Builds the endpoint to `address` now, so that the first transfer does not wire it up.
  void Connect(const std::string& address);
  const std::string& transports() const { return worker_->transports(); }

 private:
  struct Batch;
  struct Op {
    std::shared_ptr<Batch> batch;
    size_t message = 0;
  };
  UcxKvClient() = default;
  absl::Status Run(const std::string& address, const LeaseGrant& lease,
                   std::span<const ArenaRegion> regions, std::span<std::string> out,
                   Clock::time_point deadline, const std::function<void()>& meanwhile,
                   const Arrived& arrived);
  // Worker thread only.
  void Start(const std::shared_ptr<Batch>& batch);
  void Finish(uint64_t request_id, absl::Status status);
  void FailAll(const std::string& address, const absl::Status& status);
  ucs_status_t OnReply(bool get, const void* header, size_t header_length, void* data,
                       size_t length, const ucp_am_recv_param_t* param);

  std::unique_ptr<fabric::UcxWorker> worker_;
  size_t blocks_per_message_ = 1;
  std::atomic<uint64_t> next_request_id_{1};
  // Worker thread only.
  absl::flat_hash_map<uint64_t, Op> ops_;

  absl::Mutex paths_mu_;
  absl::flat_hash_map<std::string, int> paths_ ABSL_GUARDED_BY(paths_mu_);  // by address

  std::atomic<int64_t> put_blocks_{0}, get_blocks_{0}, put_bytes_{0}, get_bytes_{0};
  std::atomic<int64_t> failed_batches_{0};
};

// The fabric ArenaPath to one shard (AttachFabric's answer).
class UcxArenaPath final : public ArenaPath {
 public:
  UcxArenaPath(std::shared_ptr<UcxKvClient> client, std::string address, uint64_t instance_id,
               int64_t arena_bytes, std::chrono::milliseconds timeout)
      : client_(std::move(client)),
        address_(std::move(address)),
        instance_id_(instance_id),
        arena_bytes_(arena_bytes),
        timeout_(timeout) {
    client_->AddPath(address_);
  }
  ~UcxArenaPath() override { client_->RemovePath(address_); }
  UcxArenaPath(const UcxArenaPath&) = delete;
  UcxArenaPath& operator=(const UcxArenaPath&) = delete;

  uint64_t instance_id() const override { return instance_id_; }
  int64_t size() const override { return arena_bytes_; }
  bool keyed() const override { return true; }
  absl::Status CheckRegion(int64_t offset, int64_t length) const override;
  absl::StatusOr<std::vector<uint64_t>> Write(const LeaseGrant& lease,
                                              std::span<const ArenaRegion> regions) override;
  absl::StatusOr<std::vector<uint64_t>> Read(const LeaseGrant& lease,
                                             std::span<const ArenaRegion> regions,
                                             std::span<std::string> out) override;
  void Connect() override { client_->Connect(address_); }

 private:
  const std::shared_ptr<UcxKvClient> client_;
  const std::string address_;
  const uint64_t instance_id_;
  const int64_t arena_bytes_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace tandem::store
