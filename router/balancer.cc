#include "router/balancer.h"

#include <algorithm>

namespace tandem::router {
namespace {

constexpr std::chrono::milliseconds kBucket(100);

}  // namespace

Balancer::Balancer(const BalancerOptions& options, metrics::BalancerMetrics* metrics)
    : options_(options), metrics_(metrics) {}

void Balancer::RecordLookups(int hits, int misses, Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  if (buckets_.empty() || now - buckets_.back().time >= kBucket) buckets_.push_back({now});
  buckets_.back().hits += hits;
  buckets_.back().misses += misses;
  hits_ += hits;
  misses_ += misses;
  Update(now);
}

void Balancer::RecordReschedule() {
  absl::MutexLock lock(&mu_);
  ++reschedules_;
  if (metrics_ != nullptr) metrics_->reschedules->Increment();
}

bool Balancer::engaged(Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  Update(now);
  return engaged_;
}

std::optional<double> Balancer::HitRate(Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  Expire(now);
  return RateLocked();
}

int64_t Balancer::reschedules() const {
  absl::MutexLock lock(&mu_);
  return reschedules_;
}

void Balancer::PublishRecommendedRatio(int prefill_workers, int decode_workers,
                                       Clock::time_point now) {
  if (metrics_ == nullptr || decode_workers <= 0) return;
  absl::MutexLock lock(&mu_);
  Update(now);
  double ratio = static_cast<double>(prefill_workers) / decode_workers;
  const std::optional<double> rate = RateLocked();
  if (engaged_ && rate.has_value()) {
    ratio *= std::max(0.0, *rate) / options_.hit_rate_threshold;
  }
  metrics_->recommended_prefill_to_decode_ratio->Set(ratio);
}

void Balancer::Expire(Clock::time_point now) {
  while (!buckets_.empty() && now - buckets_.front().time > options_.window) {
    hits_ -= buckets_.front().hits;
    misses_ -= buckets_.front().misses;
    buckets_.pop_front();
  }
}

std::optional<double> Balancer::RateLocked() const {
  const int64_t lookups = hits_ + misses_;
  if (lookups < options_.min_lookups || lookups == 0) return std::nullopt;
  return static_cast<double>(hits_) / lookups;
}

void Balancer::Update(Clock::time_point now) {
  Expire(now);
  const std::optional<double> rate = RateLocked();
  if (rate.has_value()) {
    if (!engaged_ && *rate < options_.hit_rate_threshold) {
      engaged_ = true;
      engaged_since_ = now;
    } else if (engaged_ && now - engaged_since_ >= options_.window &&
               *rate >= options_.hit_rate_threshold + options_.hysteresis) {
      engaged_ = false;
    }
  }
  if (metrics_ != nullptr) {
    metrics_->state->Set(engaged_ ? 1 : 0);
    if (rate.has_value()) metrics_->decode_kv_hit_ratio->Set(*rate);
  }
}

}  // namespace tandem::router
