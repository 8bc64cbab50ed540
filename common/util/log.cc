#include "common/util/log.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {

void Log(LogLevel level, std::string_view component, std::string_view message) {
  const char tag = level == LogLevel::kInfo ? 'I' : level == LogLevel::kWarning ? 'W' : 'E';
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   std::string(1, tag), " ", std::string(component), ": ", std::string(message), "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace tandem
