#include "common/engine/compute_share.h"

#include <chrono>
#include <utility>

namespace tandem::engine {

void TurnOrder::Want(Phase phase, uint64_t ticket) { queue_[Index(phase)].push_back(ticket); }

std::optional<uint64_t> TurnOrder::Grant() {
  if (held_) return std::nullopt;
  auto& decode = queue_[Index(Phase::kDecode)];
  auto& prefill = queue_[Index(Phase::kPrefill)];
  // Decode first, except that a waiting prefill step goes right after a decode step.
  Phase next;
  if (!decode.empty() && (prefill.empty() || last_ == Phase::kPrefill)) {
    next = Phase::kDecode;
  } else if (!prefill.empty()) {
    next = Phase::kPrefill;
  } else {
    return std::nullopt;
  }
  auto& queue = queue_[Index(next)];
  const uint64_t ticket = queue.front();
  queue.pop_front();
  held_ = true;
  last_ = next;
  return ticket;
}

void TurnOrder::Release() { held_ = false; }

ComputeShare::ComputeShare(int threads, TurnObserver observer)
    : pool_(threads), observer_(std::move(observer)) {}

ComputeShare::Turn ComputeShare::Acquire(Phase phase) {
  const auto start = std::chrono::steady_clock::now();
  double waited = 0;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t ticket = next_ticket_++;
    order_.Want(phase, ticket);
    if (granted_ == 0) {
      if (std::optional<uint64_t> next = order_.Grant()) granted_ = *next;
    }
    const int i = static_cast<int>(phase);
    ++stats_.turns[i];
    if (granted_ != ticket) {
      auto mine = [this, ticket] {
        mu_.AssertHeld();  // Await evaluates it under mu_
        return granted_ == ticket;
      };
      mu_.Await(absl::Condition(&mine));
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++stats_.waited_turns[i];
      stats_.wait_seconds[i] += waited;
    }
  }
  if (observer_) observer_(phase, waited);  // after unlocking
  return Turn(this);
}

void ComputeShare::Release() {
  absl::MutexLock lock(&mu_);
  order_.Release();
  granted_ = 0;
  if (std::optional<uint64_t> next = order_.Grant()) granted_ = *next;
}

int ComputeShare::Waiting(Phase phase) const {
  absl::MutexLock lock(&mu_);
  return order_.waiting(phase);
}

bool ComputeShare::Held() const {
  absl::MutexLock lock(&mu_);
  return order_.held();
}

ComputeShare::Stats ComputeShare::GetStats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tandem::engine
