// Splits a Jinja template into text and tag tokens, configured as Hugging Face transformers
// configures its environment: trim_blocks and lstrip_blocks on, keep_trailing_newline off,
// newlines normalized to "\n". Whitespace control ({%- -%} {{- -}} {#- -#}, {%+ +%}) and
// {% raw %} are resolved here, so the parser sees only the final text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat {

enum class TokenType {
  kText,        // template text outside tags
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,   // value is the decoded string
  kInteger,  // value is the literal text, digits and underscores
  kFloat,
  kOperator,  // + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line;
};

// Nesting of brackets inside one tag is bounded so the parser's recursion is too.
inline constexpr int kMaxBracketDepth = 128;

// `name` prefixes error messages: "<name> line 3: unclosed comment".
absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source, const std::string& name);

}  // namespace tandem::chat
