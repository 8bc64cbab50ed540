// Bounds on one render, so that no template (or hostile template) can hang, exhaust memory or
// overflow the stack.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::chat {

struct RenderLimits {
  size_t max_output_bytes = 16 << 20;        // the rendered prompt, and any one string
  int max_recursion_depth = 256;             // macro calls in progress, and nesting of values
  int64_t max_loop_iterations = 10'000'000;  // over the whole render
  size_t max_memory_bytes = 256 << 20;       // every string and container the render creates
  int64_t max_range = 100'000;               // one range() (Jinja's sandbox limit)
  // C++ stack the evaluation may use below Render's frame; sanitizers make frames larger, so
  // this, not a frame count alone, keeps deep templates from overflowing the thread's stack.
  size_t max_stack_bytes = 2 << 20;
};

}  // namespace tandem::chat
