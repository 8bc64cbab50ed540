#include "router/stream_watchdog.h"

#include <algorithm>

namespace tandem::router {

using Clock = std::chrono::steady_clock;

StreamWatchdog::StreamWatchdog(Clock::duration timeout) : timeout_(timeout) {
  if (timeout_ > Clock::duration::zero()) thread_ = std::thread([this] { Loop(); });
}

StreamWatchdog::~StreamWatchdog() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void StreamWatchdog::Watch(std::weak_ptr<WatchedStream> stream) {
  if (timeout_ <= Clock::duration::zero()) return;
  absl::MutexLock lock(&mu_);
  streams_.push_back(std::move(stream));
}

int StreamWatchdog::Sweep(Clock::time_point now) {
  std::vector<std::shared_ptr<WatchedStream>> live;
  {
    absl::MutexLock lock(&mu_);
    live.reserve(streams_.size());
    // Streams that are gone leave the list here.
    streams_.erase(std::remove_if(streams_.begin(), streams_.end(),
                                  [&](const std::weak_ptr<WatchedStream>& w) {
                                    std::shared_ptr<WatchedStream> s = w.lock();
                                    if (s == nullptr) return true;
                                    live.push_back(std::move(s));
                                    return false;
                                  }),
                   streams_.end());
  }
  int cancelled = 0;
  for (const auto& s : live) cancelled += s->CancelIfStalled(now, timeout_) ? 1 : 0;
  return cancelled;
}

void StreamWatchdog::Loop() {
  // A few looks per timeout: a stalled client goes between 1 and 1.25 timeouts after its write.
  const Clock::duration period = std::clamp<Clock::duration>(
      timeout_ / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
  while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(period))) Sweep(Clock::now());
}

}  // namespace tandem::router
