// Open-loop arrival schedules: when each request is sent, fixed before the run starts so that
// a slow server cannot slow the offered load down (the mistake of closed-loop benchmarks).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::bench {

// Send offsets in seconds from the start of the run, non-decreasing, for `num_requests`
// requests arriving as a Poisson process of `rate` requests per second: the first at 0, each
// next one an exponential gap (mean 1/rate) later, as vLLM's benchmark_serving.py does. A rate
// of +infinity sends every request at 0. The same seed gives the same schedule on every
// platform (mt19937_64 and inverse-CDF sampling, no std:: distribution).
std::vector<double> PoissonSchedule(int64_t num_requests, double rate, uint64_t seed);

// The schedule `tandem bench --seed SEED` sends: PoissonSchedule on a random stream of its own
// (the seed salted), so changing the prompts does not move the arrivals. `tandem plan` simulates
// the same schedule.
std::vector<double> BenchSchedule(int64_t num_requests, double rate, uint64_t seed);

}  // namespace tandem::bench
