// Times one request's stream of tokens where they are produced or relayed: the first token's
// delay from the request's arrival (TTFT), then the gap between chunks, a chunk of k tokens
// counting k gaps of gap/k (so a histogram's mean stays the mean time per output token however
// tokens are grouped). The router and the decode worker each keep one per request, so
// `tandem_inter_token_latency_seconds{role}` shows where tokens fall behind.
#pragma once

#include <prometheus/histogram.h>

#include <chrono>
#include <optional>

namespace tandem::metrics {

class TokenTiming {
 public:
  using Clock = std::chrono::steady_clock;

  explicit TokenTiming(Clock::time_point arrival) : arrival_(arrival) {}

  // Records `n` tokens produced at `now` into the histograms (either may be null). n == 0 does
  // nothing.
  void Add(int n, Clock::time_point now, prometheus::Histogram* ttft, prometheus::Histogram* itl) {
    if (n <= 0) return;
    if (!first_token_at_.has_value()) {
      first_token_at_ = now;
      if (ttft != nullptr) ttft->Observe(Seconds(now - arrival_));
      // The rest of a first chunk came with its first token.
      if (itl != nullptr) {
        for (int i = 1; i < n; ++i) itl->Observe(0);
      }
    } else if (itl != nullptr) {
      const double gap = Seconds(now - last_token_at_) / n;
      for (int i = 0; i < n; ++i) itl->Observe(gap);
    }
    last_token_at_ = now;
  }

  Clock::time_point arrival() const { return arrival_; }
  const std::optional<Clock::time_point>& first_token_at() const { return first_token_at_; }

 private:
  static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  Clock::time_point arrival_;
  std::optional<Clock::time_point> first_token_at_;
  Clock::time_point last_token_at_;
};

}  // namespace tandem::metrics
