#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

// The `pattern` field of Split, Replace and friends: {"String": "..."} matches literally,
// {"Regex": "..."} is a PCRE2 (Oniguruma-compatible for the patterns real models use) regex.
class Pattern {
 public:
  static absl::StatusOr<Pattern> Parse(const nlohmann::json& j, const std::string& source);

  std::vector<Span> FindAll(std::string_view text) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // Shared so Pattern stays copyable.
};

// Replaces every match of `pattern` in `text` with `content`.
std::string ReplaceAll(const Pattern& pattern, std::string_view text, std::string_view content);

// Object-type checks shared by the component parsers, with errors naming `source`.
absl::Status RequireObject(const nlohmann::json& j, const std::string& source);
absl::StatusOr<std::string> TypeOf(const nlohmann::json& j, const std::string& source);

}  // namespace tandem::tokenizer
