// A one-line progress bar on stderr, redrawn in place at most ten times a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace tandem::bench {

struct Progress {
  int64_t total = 0;
  int64_t sent = 0;
  int64_t done = 0;  // finished, failed or not
  int64_t failed = 0;
  int64_t in_flight = 0;
  double elapsed_s = 0;
};

// "[#######.............]  350/1000 done, 12 failed, 64 in flight, 3.2 s"
std::string RenderProgress(const Progress& p, int bar_width = 30);

// Not thread-safe: one thread (the load generator's dispatcher) draws.
class ProgressBar {
 public:
  explicit ProgressBar(std::FILE* out) : out_(out) {}
  // Redraws unless the last draw was under 100 ms ago.
  void Update(const Progress& p);
  // Draws `p` and ends the line.
  void Finish(const Progress& p);

 private:
  std::FILE* out_;
  std::chrono::steady_clock::time_point last_{};
  bool drawn_ = false;
};

}  // namespace tandem::bench
