// The steady clock behind an interface, so tests drive time instead of sleeping (the clock is
// one of the seams STYLE.md names). Production code takes a `const TimeSource&` and passes
// TimeSource::Steady().
#pragma once

#include <chrono>

namespace tandem {

class TimeSource {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~TimeSource() = default;
  virtual Clock::time_point Now() const = 0;

  // The real steady clock; lives for the whole process.
  static const TimeSource& Steady();
};

}  // namespace tandem
