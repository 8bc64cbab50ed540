#include "common/util/time_source.h"

namespace tandem {
namespace {

class SteadyTimeSource final : public TimeSource {
 public:
  Clock::time_point Now() const override { return Clock::now(); }
};

}  // namespace

const TimeSource& TimeSource::Steady() {
  static const SteadyTimeSource steady;
  return steady;
}

}  // namespace tandem
