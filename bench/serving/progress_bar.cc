#include "bench/serving/progress_bar.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem::bench {

std::string RenderProgress(const Progress& p, int bar_width) {
  int64_t filled = p.total > 0 ? p.done * bar_width / p.total : bar_width;
  filled = std::clamp<int64_t>(filled, 0, bar_width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(bar_width - filled), '.');
  return absl::StrFormat("[%s] %*d/%d done, %d failed, %d in flight, %.1f s", bar,
                         static_cast<int>(absl::StrFormat("%d", p.total).size()), p.done, p.total,
                         p.failed, p.in_flight, p.elapsed_s);
}

void ProgressBar::Update(const Progress& p) {
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  // \r back to the start, \x1b[K clears what a longer previous line left behind.
  std::fprintf(out_, "\r%s\x1b[K", RenderProgress(p).c_str());
  std::fflush(out_);
}

void ProgressBar::Finish(const Progress& p) {
  std::fprintf(out_, "\r%s\x1b[K\n", RenderProgress(p).c_str());
  std::fflush(out_);
}

}  // namespace tandem::bench
