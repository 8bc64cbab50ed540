#include "router/workload_stats.h"

#include <algorithm>
#include <cmath>

namespace tandem::router {
namespace {

constexpr std::chrono::seconds kBucket(1);

}  // namespace

WorkloadStats::WorkloadStats(std::chrono::duration<double> window) : window_(window) {}

WorkloadStats::Moments WorkloadStats::Sums::Get() const {
  Moments m;
  m.count = n;
  if (n == 0) return m;
  m.mean = sum / static_cast<double>(n);
  // Sums of squares lose digits as samples expire; a tiny negative variance is zero.
  m.stddev = std::sqrt(std::max(0.0, sq / static_cast<double>(n) - m.mean * m.mean));
  return m;
}

WorkloadStats::Bucket& WorkloadStats::Current(Clock::time_point now) {
  if (!started_) {
    started_ = true;
    start_ = now;
  }
  Expire(now);
  if (buckets_.empty() || now - buckets_.back().time >= kBucket) {
    buckets_.emplace_back();
    buckets_.back().time = now;
  }
  return buckets_.back();
}

void WorkloadStats::RecordArrival(int64_t prompt_tokens, Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  const auto v = static_cast<double>(prompt_tokens);
  Current(now).prompt.Add(v);
  total_.prompt.Add(v);
}

void WorkloadStats::RecordFinish(int64_t output_tokens, double ttft_s, double tpot_s,
                                 Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  Bucket& b = Current(now);
  b.output.Add(static_cast<double>(output_tokens));
  total_.output.Add(static_cast<double>(output_tokens));
  b.ttft.Add(ttft_s);
  total_.ttft.Add(ttft_s);
  if (output_tokens > 1) {
    b.tpot.Add(tpot_s);
    total_.tpot.Add(tpot_s);
  }
}

void WorkloadStats::Expire(Clock::time_point now) {
  while (!buckets_.empty() && now - buckets_.front().time > window_) {
    const Bucket& b = buckets_.front();
    total_.prompt.Remove(b.prompt);
    total_.output.Remove(b.output);
    total_.ttft.Remove(b.ttft);
    total_.tpot.Remove(b.tpot);
    buckets_.pop_front();
  }
  if (buckets_.empty()) total_ = Bucket{};  // no drift left over
}

WorkloadStats::Snapshot WorkloadStats::Take(Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  Expire(now);
  Snapshot s;
  if (!started_) return s;
  s.window_s = std::min(window_.count(), std::chrono::duration<double>(now - start_).count());
  s.prompt_tokens = total_.prompt.Get();
  s.output_tokens = total_.output.Get();
  s.ttft_s = total_.ttft.Get();
  s.tpot_s = total_.tpot.Get();
  // Less than a bucket since the start: too short to call a rate.
  if (s.window_s >= std::chrono::duration<double>(kBucket).count()) {
    s.arrival_rate = static_cast<double>(s.prompt_tokens.count) / s.window_s;
  }
  return s;
}

}  // namespace tandem::router
