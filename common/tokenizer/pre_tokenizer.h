#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

// A tokenizer.json "pre_tokenizer": splits normalized text into the words BPE sees and may
// rewrite them (ByteLevel maps bytes to printable characters, Metaspace spaces to U+2581).
// Supported: Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence.
// Immutable after parsing, so shareable between threads.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits. `first_section` is true for the text before the first
  // added token, which Metaspace's prepend_scheme "first" needs.
  virtual void PreTokenize(std::vector<std::string>* pieces, bool first_section) const = 0;
};

// Null JSON gives nullptr (the whole section is one word). Unknown types are Unimplemented.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& j,
                                                                const std::string& source);

}  // namespace tandem::tokenizer
