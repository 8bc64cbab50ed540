// Jinja expressions, with Jinja's precedence (lowest first): `x if c else y`, or, and, not,
// comparisons (chained, in, not in), + -, ~, * / // %, **, unary - +, then postfix
// (.attr, [index], [a:b:c], call) and filters `|f` and tests `is t`, which bind tightest.
#pragma once

#include "absl/status/statusor.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_token_cursor.h"

namespace tandem::chat {

// Bounds the parser's recursion and the height of expression trees.
inline constexpr int kMaxExprNesting = 300;
inline constexpr int kMaxExprDepth = 256;

class ExprParser {
 public:
  explicit ExprParser(TokenCursor& cursor) : in_(cursor) {}

  // An expression, or an implicit tuple `a, b` (as in {{ a, b }} and `set x = a, b`).
  // with_condexpr=false stops before `if` (the filter of a for loop).
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr = true);
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true);
  // `| f(args) | g` after a filter block's `filter` or a block set's target.
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr subject);
  // (args) of a call, after the '('; fills call->args[1:] and call->kwargs.
  absl::Status ParseCallArgs(Expr& call);

 private:
  class DepthGuard;

  absl::StatusOr<ExprPtr> ParseCondExpr();
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseParen(int line);
  absl::StatusOr<ExprPtr> ParseList(int line);
  absl::StatusOr<ExprPtr> ParseDict(int line);
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseBinaryLevel(int level);

  absl::Status CheckFilterArgs(const Expr& filter);
  // A node of `kind` over `args`; error when the tree gets too tall.
  absl::StatusOr<ExprPtr> Make(ExprKind kind, int line, std::vector<ExprPtr> args);

  TokenCursor& in_;
  int nesting_ = 0;
};

}  // namespace tandem::chat
