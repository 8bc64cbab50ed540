// Operator-facing log lines on stderr: "2026-11-30T17:05:01.123Z W router: message". One write
// per line, so lines from different threads do not interleave.
#pragma once

#include <string_view>

namespace tandem {

enum class LogLevel { kInfo, kWarning, kError };

void Log(LogLevel level, std::string_view component, std::string_view message);

}  // namespace tandem
