#include "common/util/check.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"

namespace tandem::internal {

void CheckFailed(const char* condition, std::string_view message, const char* file, int line) {
  Log(LogLevel::kError, "check",
      absl::StrCat(file, ":", line, ": ", condition,
                   " failed: ", absl::string_view(message.data(), message.size())));
  std::abort();
}

}  // namespace tandem::internal
