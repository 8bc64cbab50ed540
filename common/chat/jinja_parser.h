// Template statements: text, {{ output }}, and the tags chat templates use (if, for, set,
// macro, call, filter, break, continue, generation). Any other tag (include, extends, block,
// import, with, do, ...) is rejected here, when the template loads, naming the tag and line.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_expr_parser.h"
#include "common/chat/jinja_token_cursor.h"

namespace tandem::chat {

// Bounds nesting of block tags ({% if %} inside {% for %} inside ...).
inline constexpr int kMaxBlockNesting = 256;

class Parser {
 public:
  // Lexes and parses `source`; `name` prefixes every error ("<name> line 3: ...").
  static absl::StatusOr<StmtList> Parse(std::string_view source, const std::string& name);

 private:
  Parser(const std::vector<Token>& tokens, const std::string& name)
      : in_(tokens, name), expr_(in_) {}

  // Statements until a block tag named in `end_tags` (left unread) or the end of input.
  absl::StatusOr<StmtList> ParseBody(const std::vector<std::string_view>& end_tags);
  absl::StatusOr<StmtPtr> ParseTag();
  absl::StatusOr<StmtPtr> ParseFor(int line);
  absl::StatusOr<StmtPtr> ParseIf(int line);
  absl::StatusOr<StmtPtr> ParseSet(int line);
  absl::StatusOr<StmtPtr> ParseMacro(int line);
  absl::StatusOr<StmtPtr> ParseCallBlock(int line);
  absl::StatusOr<StmtPtr> ParseFilterBlock(int line);
  absl::StatusOr<StmtPtr> ParseSimpleBlock(StmtKind kind, int line, std::string_view end_tag);
  absl::Status ParseParams(Stmt& stmt);
  absl::StatusOr<Target> ParseTarget(bool allow_attr);
  // Body up to {% end_tag %}, consuming the end tag.
  absl::StatusOr<StmtList> ParseBlockBody(std::string_view end_tag, int open_line,
                                          std::string_view open_tag);
  absl::Status ExpectBlockEnd();

  TokenCursor in_;
  ExprParser expr_;
  int block_nesting_ = 0;
  int loop_nesting_ = 0;
};

}  // namespace tandem::chat
