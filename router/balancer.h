// The 90% rule (DESIGN.md, "Balancer"): the decode-side KV hit rate over a sliding window
// decides whether prefill is rescheduled and paced. Engages when the rate of a window with
// enough lookups falls below the threshold; disengages once a whole window since engaging has
// a rate of at least threshold + hysteresis. A window with too few lookups changes nothing.
//
// Thread-safe; the clock is passed in so tests drive time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"

namespace tandem::router {

struct BalancerOptions {
  double hit_rate_threshold = 0.90;
  double hysteresis = 0.03;
  std::chrono::duration<double> window = std::chrono::seconds(30);
  int min_lookups = 50;
};

class Balancer {
 public:
  using Clock = std::chrono::steady_clock;

  // `metrics` may be null (no export).
  Balancer(const BalancerOptions& options, metrics::BalancerMetrics* metrics);

  // One decode admission's block lookups.
  void RecordLookups(int hits, int misses, Clock::time_point now);
  // A request re-prefilled because its blocks missed while engaged.
  void RecordReschedule();

  bool engaged(Clock::time_point now);
  // Hit rate of the current window; nullopt below min_lookups.
  std::optional<double> HitRate(Clock::time_point now);
  int64_t reschedules() const;

  // Exports the replica ratio an autoscaler should aim for, given the current pool sizes:
  // while engaged, prefill outruns what decode admits and the store holds, so the ratio
  // shrinks in proportion to the hit rate's shortfall.
  void PublishRecommendedRatio(int prefill_workers, int decode_workers, Clock::time_point now);

 private:
  struct Bucket {
    Clock::time_point time;
    int64_t hits = 0;
    int64_t misses = 0;
  };
  void Expire(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Update(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<double> RateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BalancerOptions options_;
  metrics::BalancerMetrics* const metrics_;
  mutable absl::Mutex mu_;
  std::deque<Bucket> buckets_ ABSL_GUARDED_BY(mu_);  // 100 ms each, oldest first
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;           // sums over buckets_
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  bool engaged_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point engaged_since_ ABSL_GUARDED_BY(mu_);
  int64_t reschedules_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router
