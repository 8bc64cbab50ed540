// Everything one render owns and bounds: the heap, the limits, the clock strftime_now reads.
// One per Render call, so renders of the same template share nothing mutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chat/jinja_format.h"
#include "common/chat/jinja_heap.h"
#include "common/chat/render_limits.h"

namespace tandem::chat {

class RenderState {
 public:
  RenderState(const RenderLimits& limits, std::function<absl::Time()> clock, absl::TimeZone tz)
      : limits_(limits),
        heap_(limits.max_memory_bytes, limits.max_output_bytes),
        clock_(std::move(clock)),
        time_zone_(tz),
        stack_base_(reinterpret_cast<uintptr_t>(__builtin_frame_address(0))) {
    format_.max_depth = limits.max_recursion_depth;
    format_.max_bytes = limits.max_output_bytes;
  }

  const RenderLimits& limits() const { return limits_; }
  Heap& heap() { return heap_; }
  const FormatLimits& format() const { return format_; }
  absl::Time Now() const { return clock_ ? clock_() : absl::Now(); }
  absl::TimeZone time_zone() const { return time_zone_; }

  absl::Status CountIteration() {
    if (++loop_iterations_ > limits_.max_loop_iterations) {
      return absl::ResourceExhaustedError(
          absl::StrCat("template ran more than ", limits_.max_loop_iterations, " loop iterations"));
    }
    return absl::OkStatus();
  }

  // Evaluation frames (statements and expressions in progress), bounded in number and in the
  // C++ stack they use below the frame that made this state.
  static constexpr int kMaxFrames = 3000;
  absl::Status EnterFrame() {
    uintptr_t here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    if (frames_ + 1 > kMaxFrames ||
        (here < stack_base_ && stack_base_ - here > limits_.max_stack_bytes)) {
      return absl::ResourceExhaustedError("template evaluation nested too deeply");
    }
    ++frames_;
    return absl::OkStatus();
  }
  void LeaveFrame() { --frames_; }

  absl::Status EnterMacro() {
    if (macro_depth_ >= limits_.max_recursion_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("macro calls nested more than ", limits_.max_recursion_depth, " deep"));
    }
    ++macro_depth_;
    return absl::OkStatus();
  }
  void LeaveMacro() { --macro_depth_; }

 private:
  RenderLimits limits_;
  Heap heap_;
  FormatLimits format_;
  std::function<absl::Time()> clock_;
  absl::TimeZone time_zone_;
  uintptr_t stack_base_;
  int64_t loop_iterations_ = 0;
  int frames_ = 0;
  int macro_depth_ = 0;
};

}  // namespace tandem::chat
