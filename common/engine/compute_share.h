// One process's compute, shared by the engines in it (`tandem serve` runs a prefill and a decode
// engine side by side). Instead of each engine owning a fixed share of the cores, every engine's
// model computes on one ThreadPool of `threads` threads, and engines take turns on it a step at
// a time: a step holds the whole pool, so nothing is oversubscribed, and an engine with nothing
// to do lends all of the cores to the others simply by not asking for a turn.
//
// Turns are ordered by TurnOrder: decode steps come first, and a prefill step runs only when no
// decode step waits or right after one ran. So a decode engine waits behind at most one prefill
// step per decode engine sharing the pool (one, in `tandem serve`'s default), the prefill
// engine's step size (its token budget, serve.prefill_chunk_tokens) bounds what each decode
// token can be delayed by, and prefill is never starved while decode is busy.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/util/thread_pool.h"

namespace tandem::engine {

enum class Phase { kDecode = 0, kPrefill = 1 };

// Who steps next on a shared pool: the pure policy, without threads, so a test can drive it with
// a simulated clock. Waiters of one phase are served in arrival order.
class TurnOrder {
 public:
  // A waiter (`ticket`, unique) of `phase` asks for a turn.
  void Want(Phase phase, uint64_t ticket);
  // The ticket whose turn it is, if the pool is free and anyone waits; it then holds the pool.
  std::optional<uint64_t> Grant();
  // The holder is done.
  void Release();
  bool held() const { return held_; }
  int waiting(Phase phase) const { return static_cast<int>(queue_[Index(phase)].size()); }

 private:
  static int Index(Phase phase) { return static_cast<int>(phase); }

  std::array<std::deque<uint64_t>, 2> queue_;
  bool held_ = false;
  Phase last_ = Phase::kPrefill;  // the phase of the last turn granted
};

class ComputeShare {
 public:
  struct Stats {
    std::array<int64_t, 2> turns{};         // by Phase
    std::array<int64_t, 2> waited_turns{};  // turns that had to wait for another engine's step
    std::array<double, 2> wait_seconds{};   // time spent waiting for those turns
  };

  // Told of every turn once it is granted, on the thread that asked, with the seconds it waited
  // for other engines' steps (0 when the pool was free). Must be cheap (a metric).
  using TurnObserver = std::function<void(Phase phase, double wait_seconds)>;

  // `threads` counts every compute thread of the process; 0 means one per core.
  explicit ComputeShare(int threads, TurnObserver observer = nullptr);
  ComputeShare(const ComputeShare&) = delete;
  ComputeShare& operator=(const ComputeShare&) = delete;

  // Every engine that shares the process computes on this pool, and only inside a Turn.
  ThreadPool& pool() { return pool_; }

  // Holds the pool for one step; released on destruction.
  class Turn {
   public:
    Turn(Turn&& other) noexcept : share_(other.share_) { other.share_ = nullptr; }
    Turn& operator=(Turn&&) = delete;
    ~Turn() {
      if (share_ != nullptr) share_->Release();
    }

   private:
    friend class ComputeShare;
    explicit Turn(ComputeShare* share) : share_(share) {}
    ComputeShare* share_;
  };

  // Blocks (asleep) until it is `phase`'s turn.
  Turn Acquire(Phase phase);
  Stats GetStats() const;
  // Acquire calls of `phase` still waiting for their turn.
  int Waiting(Phase phase) const;
  // Whether a turn holds the pool now.
  bool Held() const;

 private:
  void Release();

  ThreadPool pool_;
  const TurnObserver observer_;
  mutable absl::Mutex mu_;
  TurnOrder order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t granted_ ABSL_GUARDED_BY(mu_) = 0;  // the ticket holding the pool, 0 if none
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::engine
