#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

// A half-open byte range [begin, end) inside a string.
struct Span {
  size_t begin;
  size_t end;
};

// A compiled PCRE2 pattern in UTF + Unicode-property mode (JIT when the platform has it).
// Thread-safe: matching allocates its own match data, so one Regex serves every thread.
class Regex {
 public:
  // InvalidArgument naming `source` when the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern,
                                                        const std::string& source);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping, non-empty match in `text`, left to right. `text` must be valid UTF-8.
  std::vector<Span> FindAll(std::string_view text) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*; void keeps pcre2.h out of this header.
};

}  // namespace tandem::tokenizer
