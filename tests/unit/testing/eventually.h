// Waiting in tests: on a condition with a deadline, never on a bare sleep.
#pragma once

#include <chrono>
#include <functional>

namespace tandem::testing {

// Polls `condition` (every millisecond or so) until it holds or `timeout` passes; returns
// whether it held. For state another thread changes without a signal to wait on.
bool Eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace tandem::testing
