// A TimeSource that moves only when the test says so.
#pragma once

#include <atomic>

#include "common/util/time_source.h"

namespace tandem::testing {

class ManualTimeSource final : public TimeSource {
 public:
  Clock::time_point Now() const override { return Clock::time_point(Clock::duration(now_.load())); }
  void Advance(std::chrono::duration<double> d) {
    now_ += std::chrono::duration_cast<Clock::duration>(d).count();
  }

 private:
  std::atomic<Clock::rep> now_{std::chrono::duration_cast<Clock::duration>(std::chrono::hours(1))
                                   .count()};  // well past the epoch, as a steady clock is
};

}  // namespace tandem::testing
