// The syntax tree of a compiled template. Immutable after parsing, so renders share it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_value.h"

namespace tandem::chat {

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // args: items
  kTuple,     // args: items
  kDict,      // args: key, value, key, value, ...
  kGetAttr,   // args[0].name
  kGetItem,   // args[0][args[1]]
  kSlice,     // args[0][args[1]:args[2]:args[3]], each bound may be null
  kCall,      // args[0](args[1:], kwargs)
  kFilter,    // args[0] | name(args[1:], kwargs); args[0] is null in a filter block chain
  kTest,      // args[0] is name(args[1:], kwargs)
  kNeg,       // -args[0]
  kPos,       // +args[0]
  kNot,       // not args[0]
  kAnd,       // args[0] and args[1]
  kOr,        // args[0] or args[1]
  kBinary,    // args[0] op args[1]
  kCompare,   // args[0] compare_ops[0] args[1] compare_ops[1] args[2] ...
  kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  int depth = 1;  // height of this subtree; bounded so evaluation recursion is
  Value literal;
  std::string name;
  BinaryOp op = BinaryOp::kAdd;
  std::vector<CompareOp> compare_ops;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  FilterFn filter = nullptr;  // kFilter, resolved when parsing
  TestFn test = nullptr;      // kTest
};

enum class StmtKind {
  kText,
  kOutput,       // {{ expr }}
  kIf,           // branches
  kFor,          // for target in expr [if cond] body [else else_body]
  kSet,          // set target = expr
  kSetBlock,     // set target [| filters] body endset; expr: the filter chain or null
  kMacro,        // macro name(params) body
  kCallBlock,    // call[(params)] expr body endcall
  kFilterBlock,  // filter f|g body endfilter; expr: the chain, its innermost input null
  kBreak,
  kContinue,
  kGeneration,  // generation body endgeneration: renders body unchanged
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

// The left side of `set` or the variables of `for`.
struct Target {
  std::vector<std::string> names;  // one name, or several to unpack a tuple
  bool unpack = false;
  std::string attr;  // `set ns.attr = ...`: names[0] is the namespace
};

struct IfBranch {
  ExprPtr cond;  // null for else
  StmtList body;
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  Target target;
  std::vector<IfBranch> branches;
  StmtList body;
  StmtList else_body;
  std::string name;                 // kMacro
  std::vector<std::string> params;  // kMacro, kCallBlock
  std::vector<ExprPtr> defaults;    // parallel to params; null when none
};

}  // namespace tandem::chat
