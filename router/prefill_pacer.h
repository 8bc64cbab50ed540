// The balancer's throttle on prefill (DESIGN.md, "Balancer"): while the balancer is engaged, a
// new prefill waits while the KV bytes prefilled but not yet taken up by decode ("ahead") would
// pass `max_ahead_bytes`. The pacer owns that ledger and the queue of waiting prefills.
//
// Each request holds at most one entry, under a key its caller chooses: counted (its bytes are
// in the ledger) or queued (waiting, not counted). Release ends the entry whichever it is, so a
// request cancelled while queued leaves the queue and costs the ledger nothing, and releasing
// twice is harmless.
//
// The pacer never runs a prefill itself. Every call that may let queued prefills through
// appends their start functions to `*run`, and the caller runs them once it holds no lock (the
// deferred-work idiom of router/generate_call.cc), so a start never runs under the lock of the
// request that released room for it. Whether the balancer is engaged is passed in, read by the
// caller before it calls: the pacer calls out to nothing. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tandem::router {

class PrefillPacer {
 public:
  using Start = std::function<void()>;
  // Prefills that may start now, to be run by the caller after it releases its locks.
  using Runnable = std::vector<Start>;

  // `max_ahead_bytes` <= 0 paces nothing.
  explicit PrefillPacer(int64_t max_ahead_bytes) : max_ahead_bytes_(max_ahead_bytes) {}

  // Asks to run `key`'s prefill of `bytes` KV bytes. Unless it must wait, the bytes are counted
  // and `start` is appended to `*run`; otherwise it is queued until a release makes room, the
  // balancer disengages, or Release(key) drops it. A high-priority prefill never waits, and
  // neither does one whose key already holds counted bytes (a retry after a worker failed: it
  // was paced once already), which counts `bytes` more.
  void Schedule(uint64_t key, int64_t bytes, bool high_priority, bool engaged, Start start,
                Runnable* run);
  // `key`'s bytes are no longer ahead: decode took them up, or the request ended. A queued key
  // leaves the queue; an unknown key changes nothing. Appends the prefills this lets through.
  void Release(uint64_t key, bool engaged, Runnable* run);
  // Lets queued prefills through if they fit now (after the balancer disengaged, say).
  void Poll(bool engaged, Runnable* run);

  int64_t ahead_bytes() const;
  int queued() const;

 private:
  struct Entry {
    int64_t bytes = 0;
    bool counted = false;
    Start start;  // while queued
  };
  bool Fits(int64_t bytes, bool engaged) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Drain(bool engaged, Runnable* run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_ahead_bytes_;
  mutable absl::Mutex mu_;
  int64_t ahead_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // sum of counted entries' bytes
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // queued keys, oldest first
};

}  // namespace tandem::router
