// Always-on invariant checks, for the conditions whose failure would corrupt memory if the
// program went on (a refcount below zero, an iterator past the end dereferenced): unlike
// `assert`, they stay in Release builds, as Envoy's RELEASE_ASSERT does. A failed check logs the
// condition, the place and the message, then aborts. Never for bad input: that is a Status.
#pragma once

#include <string_view>

namespace tandem::internal {

[[noreturn]] void CheckFailed(const char* condition, std::string_view message, const char* file,
                              int line);

}  // namespace tandem::internal

#define TANDEM_CHECK(condition, message)                                          \
  do {                                                                            \
    if (__builtin_expect(!(condition), 0)) {                                      \
      ::tandem::internal::CheckFailed(#condition, (message), __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
