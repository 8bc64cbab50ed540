// Leases on what a shard holds for its shared-memory and fabric clients (shm_handoff.h):
// reservations a writer fills in place, pins a reader copies from. A lease ends when its client
// commits or releases it, or when it expires, so a client that dies mid-transfer holds space or
// pins for at most the lease time.
//
// A fabric lease also has a key, a 128-bit secret from the kernel's CSPRNG that the client
// learns over the authenticated control plane and shows with every data-plane transfer
// (cache_store/ucx_data_plane.h). A transfer borrows the lease: what it holds stays put until
// the transfer ends, even if the lease ends meanwhile; a write lease is not committed while one
// of its transfers is in flight.
//
// Thread-safe. A reaper thread ends expired leases; destruction ends all of them. It must be
// destroyed before the BlockStore its leases point into.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache_store/block_store.h"

namespace tandem::cache_store {

struct ShmLeaseOptions {
  std::chrono::milliseconds ttl = std::chrono::seconds(30);
  int max_leases = 4096;  // beyond: ResourceExhausted, so a runaway client cannot pin everything
};

class ShmLeases {
 public:
  // Exactly one of the two is non-empty.
  struct Lease {
    std::vector<PendingPut> puts;  // a write lease: reservations, until committed
    std::vector<BlockRef> pins;    // a read lease: pinned blocks, until released
  };
  enum class Kind { kWrite, kRead, kAny };
  using Key = std::array<uint64_t, 2>;
  struct Added {
    uint64_t id = 0;
    Key key{};  // zero unless keyed
  };

  explicit ShmLeases(const ShmLeaseOptions& options);
  ~ShmLeases();
  ShmLeases(const ShmLeases&) = delete;
  ShmLeases& operator=(const ShmLeases&) = delete;

  // Holds `lease` until Take or expiry and returns its id (never 0, unpredictable) and, when
  // `keyed`, its key. `owner` (the client's connection) is the only one that may take it.
  absl::StatusOr<Added> Add(Lease lease, std::string owner = "", bool keyed = false);
  // Ends the lease and hands back what it held, shared with the transfers still borrowing it.
  // NotFound if it is unknown, ended or expired; InvalidArgument (the lease stays) if it is not
  // of `kind`; PermissionDenied (the lease stays) if `owner` is not the one that added it;
  // FailedPrecondition (the lease stays) for a write lease with a transfer in flight.
  absl::StatusOr<std::shared_ptr<Lease>> Take(uint64_t id, Kind kind,
                                              const std::string& owner = "");
  // The lease, for one data-plane transfer, if `key` is its key and it is of `kind` (not kAny);
  // PermissionDenied otherwise, with one message whatever was wrong. Keep the pointer until the
  // transfer ends and no longer.
  absl::StatusOr<std::shared_ptr<const Lease>> Borrow(uint64_t id, const Key& key, Kind kind);

  std::chrono::milliseconds ttl() const { return options_.ttl; }
  int64_t open() const;
  int64_t expired() const;  // leases ended by expiry since creation

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    std::shared_ptr<Lease> lease;
    Clock::time_point deadline;
    std::string owner;
    bool keyed = false;
    Key key{};
  };
  void Reap();

  const ShmLeaseOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Held> leases_ ABSL_GUARDED_BY(mu_);
  absl::BitGen ids_ ABSL_GUARDED_BY(mu_);
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;  // last: it starts once the rest is built
};

}  // namespace tandem::cache_store
