// The shard's half of the KV fabric (common/fabric/kv_protocol.h): a UCX worker that moves
// block bytes between the store's arena and workers on other machines, one active message per
// run of blocks, under the leases ShmHandoff hands out with keys over gRPC. Every message is
// checked against its lease's key and each block's exact region before a byte moves; a
// transfer borrows the lease, so its blocks stay reserved or pinned until the bytes have moved
// even if the lease ends meanwhile, and no longer than the lease time: a transfer still in
// progress then (a peer that died or stopped answering) is cancelled. Put bytes are received
// straight into the arena (UCX rendezvous, an iovec of the blocks' regions); a get's one block
// is sent straight from it where UCX can cancel the send, and a copy otherwise (several
// blocks packed, or UCX's shared-memory transports). The arena is registered with UCX once.
//
// Thread-safe: all work happens on the worker's thread. The ShmHandoff and its store must
// outlive it.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cache_store/shm_handoff.h"
#include "common/fabric/ucx_worker.h"
#include "tandem/v1/cache_store.pb.h"

namespace tandem::cache_store {

// Counters since creation, for each direction: put (into the arena) and get (out of it).
struct UcxDataPlaneStats {
  struct Direction {
    int64_t blocks = 0;  // moved
    int64_t bytes = 0;
    int64_t messages = 0;   // that moved them
    int64_t refused = 0;    // messages refused: a wrong key, lease, region or header
    int64_t failed = 0;     // transfers UCX failed (a peer gone mid-transfer)
    int64_t timed_out = 0;  // transfers cancelled at the lease time (a peer that stopped answering)
  };
  Direction put, get;
};

class UcxDataPlane {
 public:
  // FailedPrecondition without an arena; Unavailable when UCX cannot start.
  // `transports` as UcxWorkerOptions::transports.
  static absl::StatusOr<std::unique_ptr<UcxDataPlane>> Create(ShmHandoff& handoff,
                                                              const std::string& transports = "");
  // Stops the worker; transfers in flight fail (their peers see a miss).
  ~UcxDataPlane();
  UcxDataPlane(const UcxDataPlane&) = delete;
  UcxDataPlane& operator=(const UcxDataPlane&) = delete;

  void Attach(tandem::v1::AttachFabricResponse* response) const;
  const std::string& transports() const { return worker_->transports(); }
  UcxDataPlaneStats Stats() const;

 private:
  explicit UcxDataPlane(ShmHandoff& handoff) : handoff_(handoff) {}
  ucs_status_t OnPut(const void* header, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param);
  ucs_status_t OnGet(const void* header, size_t header_length, const ucp_am_recv_param_t* param);
  // Sends kPutDone or a refused kGetDone (no bytes) to `ep`.
  void Reply(ucp_ep_h ep, unsigned id, uint64_t request_id, absl::StatusCode code);

  // UcxDataPlaneStats::Direction's counters, updated from any thread.
  struct Counters {
    std::atomic<int64_t> blocks{0}, bytes{0}, messages{0}, refused{0}, failed{0}, timed_out{0};
    void Moved(size_t n, int64_t b) {
      blocks += static_cast<int64_t>(n);
      bytes += b;
      ++messages;
    }
    UcxDataPlaneStats::Direction Load() const;
  };
  // One message's blocks moving after its handler returned (cache_store/ucx_data_plane.cc).
  struct Transfer;
  // Worker thread only: a transfer is tracked from its start until UCX completes it, and
  // cancelled if that takes longer than the lease time. Returns its serial.
  uint64_t Track(Transfer* transfer, Counters& counters);
  // Whether `serial` was still live (not cancelled); it is no longer tracked.
  bool Untrack(uint64_t serial);
  // Cancels the transfers past their deadline, with every other on their peers' endpoints; one
  // sweep is pending at a time, at the earliest deadline.
  void Sweep();

  ShmHandoff& handoff_;
  ucp_mem_h arena_memh_ = nullptr;
  Counters put_, get_;
  // Worker thread only: the transfers UCX has not completed, by serial. A cancelled one stays
  // until UCX completes it; one UCX never completes (a send to a dead peer over shared memory)
  // is freed when the plane is destroyed.
  struct Tracked {
    Transfer* transfer = nullptr;
    Counters* counters = nullptr;
    std::chrono::steady_clock::time_point deadline;
    bool cancelled = false;
  };
  absl::flat_hash_map<uint64_t, Tracked> transfers_;
  uint64_t next_serial_ = 0;
  bool sweep_pending_ = false;
  std::unique_ptr<fabric::UcxWorker> worker_;  // last: its thread uses the rest
};

}  // namespace tandem::cache_store
