// A read position in a template's tokens, shared by the statement and expression parsers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/chat/jinja_lexer.h"

namespace tandem::chat {

class TokenCursor {
 public:
  // `tokens` ends with kEof and outlives the cursor.
  TokenCursor(const std::vector<Token>& tokens, std::string name)
      : tokens_(tokens), name_(std::move(name)) {}

  const Token& Peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& Next() {
    const Token& t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.type == TokenType::kOperator && t.value == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.type == TokenType::kName && t.value == name;
  }
  bool Is(TokenType type) const { return Peek().type == type; }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  absl::Status ExpectOp(std::string_view op) {
    if (SkipOp(op)) return absl::OkStatus();
    return Error(Peek(), absl::StrCat("expected '", std::string(op), "', got ", Describe(Peek())));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (!Is(TokenType::kName)) {
      return Error(Peek(), absl::StrCat("expected a name, got ", Describe(Peek())));
    }
    return Next().value;
  }
  absl::Status Error(const Token& at, std::string_view msg) const {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, " line ", at.line, ": ", std::string(msg)));
  }
  const std::string& name() const { return name_; }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText:
        return "template text";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kEof:
        return "end of template";
      case TokenType::kString:
        return "a string";
      default:
        return absl::StrCat("'", t.value, "'");
    }
  }

 private:
  const std::vector<Token>& tokens_;
  std::string name_;
  size_t pos_ = 0;
};

}  // namespace tandem::chat
