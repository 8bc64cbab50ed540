// A fuzz target's scratch directory: made once under TMPDIR (else /tmp) and removed with what
// it holds when the fuzzer exits, so that runs leave nothing behind.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace tandem::fuzzing {

inline const std::string& TempDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem_fuzz.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  static const int removed_at_exit = std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  });
  static_cast<void>(removed_at_exit);
  return dir;
}

}  // namespace tandem::fuzzing
