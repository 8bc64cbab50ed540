// What the router's traffic looks like lately (issue #21, "Use it"): over a sliding window, the
// arrival rate, the prompt and output lengths (mean and spread), and the measured time to first
// token and time per output token. The planner advisor (planner_advisor.h) turns it into a
// planner::Workload and sizes the deployment for it.
//
// Thread-safe; the clock is passed in so tests drive time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::router {

class WorkloadStats {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkloadStats(std::chrono::duration<double> window = std::chrono::minutes(5));

  // A request admitted with this many prompt tokens.
  void RecordArrival(int64_t prompt_tokens, Clock::time_point now);
  // A request that finished (stop or length) after generating `output_tokens`, its first token
  // `ttft_s` after arrival and the rest `tpot_s` apart (ignored for one-token outputs).
  void RecordFinish(int64_t output_tokens, double ttft_s, double tpot_s, Clock::time_point now);

  struct Moments {
    int64_t count = 0;
    double mean = 0;
    double stddev = 0;  // population
  };
  struct Snapshot {
    double window_s = 0;      // what the figures cover: the window, or less since the start
    double arrival_rate = 0;  // requests/s
    Moments prompt_tokens;    // of arrivals
    Moments output_tokens;    // of finished requests
    Moments ttft_s;
    Moments tpot_s;
  };
  Snapshot Take(Clock::time_point now);

 private:
  // Sums of one kind of sample: count, sum and sum of squares.
  struct Sums {
    int64_t n = 0;
    double sum = 0, sq = 0;
    void Add(double v) {
      ++n;
      sum += v;
      sq += v * v;
    }
    void Remove(const Sums& o) {
      n -= o.n;
      sum -= o.sum;
      sq -= o.sq;
    }
    Moments Get() const;
  };
  struct Bucket {
    Clock::time_point time;
    Sums prompt, output, ttft, tpot;
  };
  Bucket& Current(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Expire(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::chrono::duration<double> window_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point start_ ABSL_GUARDED_BY(mu_);     // the first record
  std::deque<Bucket> buckets_ ABSL_GUARDED_BY(mu_);  // 1 s each, oldest first
  Bucket total_ ABSL_GUARDED_BY(mu_);                // sums over buckets_
};

}  // namespace tandem::router
