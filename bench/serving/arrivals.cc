#include "bench/serving/arrivals.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace tandem::bench {

std::vector<double> PoissonSchedule(int64_t num_requests, double rate, uint64_t seed) {
  std::vector<double> offsets(static_cast<size_t>(std::max<int64_t>(num_requests, 0)), 0.0);
  if (std::isinf(rate)) return offsets;
  std::mt19937_64 rng(seed);
  double t = 0;
  for (size_t i = 1; i < offsets.size(); ++i) {
    // u in (0, 1] from the top 53 bits, so log(u) is finite.
    double u = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
    t += -std::log(u) / rate;
    offsets[i] = t;
  }
  return offsets;
}

std::vector<double> BenchSchedule(int64_t num_requests, double rate, uint64_t seed) {
  constexpr uint64_t kScheduleSeedSalt = 0x9e3779b97f4a7c15ULL;
  return PoissonSchedule(num_requests, rate, seed ^ kScheduleSeedSalt);
}

}  // namespace tandem::bench
