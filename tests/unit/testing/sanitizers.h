// Whether this build runs under AddressSanitizer or ThreadSanitizer. Both keep shadow memory
// beside the program's and touch it on accesses: what a test counts in page faults or resident
// memory then includes theirs.
#pragma once

namespace tandem::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace tandem::testing
