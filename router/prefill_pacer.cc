#include "router/prefill_pacer.h"

#include <algorithm>
#include <utility>

namespace tandem::router {

bool PrefillPacer::Fits(int64_t bytes, bool engaged) const {
  return !engaged || max_ahead_bytes_ <= 0 || ahead_bytes_ == 0 ||
         ahead_bytes_ + bytes <= max_ahead_bytes_;
}

void PrefillPacer::Schedule(uint64_t key, int64_t bytes, bool high_priority, bool engaged,
                            Start start, Runnable* run) {
  absl::MutexLock lock(&mu_);
  Drain(engaged, run);  // those already waiting go first
  auto [it, inserted] = entries_.try_emplace(key);
  Entry& entry = it->second;
  if (!inserted && !entry.counted) {
    // Already queued: the newer request replaces the older one in place (same turn).
    entry.bytes = bytes;
    entry.start = std::move(start);
    if (high_priority) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), key));
      entry.counted = true;
      ahead_bytes_ += entry.bytes;
      run->push_back(std::move(entry.start));
      entry.start = nullptr;
    }
    return;
  }
  if (entry.counted || high_priority || (queue_.empty() && Fits(bytes, engaged))) {
    entry.counted = true;
    entry.bytes += bytes;
    ahead_bytes_ += bytes;
    run->push_back(std::move(start));
    return;
  }
  entry.bytes = bytes;
  entry.start = std::move(start);
  queue_.push_back(key);
}

void PrefillPacer::Release(uint64_t key, bool engaged, Runnable* run) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.counted) {
    ahead_bytes_ -= it->second.bytes;
  } else {
    queue_.erase(std::find(queue_.begin(), queue_.end(), key));
  }
  entries_.erase(it);
  Drain(engaged, run);
}

void PrefillPacer::Poll(bool engaged, Runnable* run) {
  absl::MutexLock lock(&mu_);
  Drain(engaged, run);
}

void PrefillPacer::Drain(bool engaged, Runnable* run) {
  while (!queue_.empty()) {
    Entry& entry = entries_.at(queue_.front());
    if (!Fits(entry.bytes, engaged)) return;
    entry.counted = true;
    ahead_bytes_ += entry.bytes;
    run->push_back(std::move(entry.start));
    entry.start = nullptr;
    queue_.pop_front();
  }
}

int64_t PrefillPacer::ahead_bytes() const {
  absl::MutexLock lock(&mu_);
  return ahead_bytes_;
}

int PrefillPacer::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace tandem::router
