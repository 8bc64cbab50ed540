#include "common/chat/jinja_expr_parser.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tandem::chat {
namespace {

absl::StatusOr<Int> ParseIntLiteral(std::string text) {
  std::erase(text, '_');
  int base = 10;
  size_t start = 0;
  if (text.size() > 1 && text[0] == '0') {
    char b = static_cast<char>(std::tolower(static_cast<unsigned char>(text[1])));
    base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
    if (base != 10) start = 2;
  }
  Int v = 0;
  for (size_t i = start; i < text.size(); ++i) {
    char c = static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
    int d = c <= '9' ? c - '0' : c - 'a' + 10;
    if (__builtin_mul_overflow(v, static_cast<Int>(base), &v) ||
        __builtin_add_overflow(v, static_cast<Int>(d), &v)) {
      return absl::InvalidArgumentError("integer literal too large");
    }
  }
  return v;
}

bool IsFilterOrTestArgStart(const Token& t) {
  switch (t.type) {
    case TokenType::kName:
      return t.value != "else" && t.value != "or" && t.value != "and";
    case TokenType::kString:
    case TokenType::kInteger:
    case TokenType::kFloat:
      return true;
    case TokenType::kOperator:
      return t.value == "(" || t.value == "[" || t.value == "{";
    default:
      return false;
  }
}

}  // namespace

class ExprParser::DepthGuard {
 public:
  explicit DepthGuard(ExprParser& p) : p_(p) { ++p_.nesting_; }
  ~DepthGuard() { --p_.nesting_; }
  absl::Status Check() const {
    if (p_.nesting_ <= kMaxExprNesting) return absl::OkStatus();
    return p_.in_.Error(p_.in_.Peek(), "expression nested too deeply");
  }

 private:
  ExprParser& p_;
};

absl::StatusOr<ExprPtr> ExprParser::Make(ExprKind kind, int line, std::vector<ExprPtr> args) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  e->args = std::move(args);
  for (const auto& a : e->args) {
    if (a) e->depth = std::max(e->depth, a->depth + 1);
  }
  if (e->depth > kMaxExprDepth) return in_.Error(in_.Peek(), "expression nested too deeply");
  return e;
}

absl::StatusOr<ExprPtr> ExprParser::ParseTuple(bool with_condexpr) {
  int line = in_.Peek().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) {
      if (auto s = in_.ExpectOp(","); !s.ok()) return s;
    }
    if (in_.Is(TokenType::kVarEnd) || in_.Is(TokenType::kBlockEnd) || in_.IsOp(")")) break;
    auto e = ParseExpression(with_condexpr);
    if (!e.ok()) return e.status();
    items.push_back(std::move(*e));
    if (!in_.IsOp(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    return in_.Error(in_.Peek(), absl::StrCat("expected an expression, got ",
                                              TokenCursor::Describe(in_.Peek())));
  }
  return Make(ExprKind::kTuple, line, std::move(items));
}

absl::StatusOr<ExprPtr> ExprParser::ParseExpression(bool with_condexpr) {
  return with_condexpr ? ParseCondExpr() : ParseOr();
}

absl::StatusOr<ExprPtr> ExprParser::ParseCondExpr() {
  DepthGuard guard(*this);
  if (auto s = guard.Check(); !s.ok()) return s;
  int line = in_.Peek().line;
  auto expr1 = ParseOr();
  if (!expr1.ok()) return expr1;
  ExprPtr node = std::move(*expr1);
  while (in_.SkipName("if")) {
    auto cond = ParseOr();
    if (!cond.ok()) return cond;
    ExprPtr otherwise;
    if (in_.SkipName("else")) {
      auto e = ParseCondExpr();
      if (!e.ok()) return e;
      otherwise = std::move(*e);
    }
    std::vector<ExprPtr> args;
    args.push_back(std::move(*cond));
    args.push_back(std::move(node));
    args.push_back(std::move(otherwise));
    auto made = Make(ExprKind::kCondExpr, line, std::move(args));
    if (!made.ok()) return made;
    node = std::move(*made);
  }
  return node;
}

absl::StatusOr<ExprPtr> ExprParser::ParseOr() {
  auto left = ParseAnd();
  if (!left.ok()) return left;
  ExprPtr node = std::move(*left);
  while (in_.IsName("or")) {
    int line = in_.Next().line;
    auto right = ParseAnd();
    if (!right.ok()) return right;
    std::vector<ExprPtr> args;
    args.push_back(std::move(node));
    args.push_back(std::move(*right));
    auto made = Make(ExprKind::kOr, line, std::move(args));
    if (!made.ok()) return made;
    node = std::move(*made);
  }
  return node;
}

absl::StatusOr<ExprPtr> ExprParser::ParseAnd() {
  auto left = ParseNot();
  if (!left.ok()) return left;
  ExprPtr node = std::move(*left);
  while (in_.IsName("and")) {
    int line = in_.Next().line;
    auto right = ParseNot();
    if (!right.ok()) return right;
    std::vector<ExprPtr> args;
    args.push_back(std::move(node));
    args.push_back(std::move(*right));
    auto made = Make(ExprKind::kAnd, line, std::move(args));
    if (!made.ok()) return made;
    node = std::move(*made);
  }
  return node;
}

absl::StatusOr<ExprPtr> ExprParser::ParseNot() {
  if (!in_.IsName("not")) return ParseCompare();
  DepthGuard guard(*this);
  if (auto s = guard.Check(); !s.ok()) return s;
  int line = in_.Next().line;
  auto operand = ParseNot();
  if (!operand.ok()) return operand;
  std::vector<ExprPtr> args;
  args.push_back(std::move(*operand));
  return Make(ExprKind::kNot, line, std::move(args));
}

absl::StatusOr<ExprPtr> ExprParser::ParseCompare() {
  int line = in_.Peek().line;
  auto first = ParseMath1();
  if (!first.ok()) return first;
  std::vector<ExprPtr> operands;
  operands.push_back(std::move(*first));
  std::vector<CompareOp> ops;
  static const std::pair<const char*, CompareOp> kOps[] = {
      {"==", CompareOp::kEq}, {"!=", CompareOp::kNe}, {"<", CompareOp::kLt},
      {"<=", CompareOp::kLe}, {">", CompareOp::kGt},  {">=", CompareOp::kGe}};
  while (true) {
    bool matched = false;
    for (const auto& [text, op] : kOps) {
      if (in_.SkipOp(text)) {
        ops.push_back(op);
        matched = true;
        break;
      }
    }
    if (!matched) {
      if (in_.SkipName("in")) {
        ops.push_back(CompareOp::kIn);
      } else if (in_.IsName("not") && in_.IsName("in", 1)) {
        in_.Next();
        in_.Next();
        ops.push_back(CompareOp::kNotIn);
      } else {
        break;
      }
    }
    auto operand = ParseMath1();
    if (!operand.ok()) return operand;
    operands.push_back(std::move(*operand));
  }
  if (ops.empty()) return std::move(operands[0]);
  auto made = Make(ExprKind::kCompare, line, std::move(operands));
  if (made.ok()) (*made)->compare_ops = std::move(ops);
  return made;
}

// Levels 0: + -   1: ~   2: * / // %   3: **   (all left-associative, as in Jinja).
absl::StatusOr<ExprPtr> ExprParser::ParseBinaryLevel(int level) {
  static const std::vector<std::pair<const char*, BinaryOp>> kLevels[] = {
      {{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}},
      {{"~", BinaryOp::kConcat}},
      {{"*", BinaryOp::kMul},
       {"/", BinaryOp::kDiv},
       {"//", BinaryOp::kFloorDiv},
       {"%", BinaryOp::kMod}},
      {{"**", BinaryOp::kPow}},
  };
  auto next = [&]() { return level == 3 ? ParseUnary(true) : ParseBinaryLevel(level + 1); };
  auto left = next();
  if (!left.ok()) return left;
  ExprPtr node = std::move(*left);
  while (true) {
    const std::pair<const char*, BinaryOp>* hit = nullptr;
    for (const auto& entry : kLevels[level]) {
      if (in_.IsOp(entry.first)) hit = &entry;
    }
    if (hit == nullptr) return node;
    int line = in_.Next().line;
    auto right = next();
    if (!right.ok()) return right;
    std::vector<ExprPtr> args;
    args.push_back(std::move(node));
    args.push_back(std::move(*right));
    auto made = Make(ExprKind::kBinary, line, std::move(args));
    if (!made.ok()) return made;
    (*made)->op = hit->second;
    node = std::move(*made);
  }
}

absl::StatusOr<ExprPtr> ExprParser::ParseMath1() { return ParseBinaryLevel(0); }
absl::StatusOr<ExprPtr> ExprParser::ParseConcat() { return ParseBinaryLevel(1); }
absl::StatusOr<ExprPtr> ExprParser::ParseMath2() { return ParseBinaryLevel(2); }
absl::StatusOr<ExprPtr> ExprParser::ParsePow() { return ParseBinaryLevel(3); }

absl::StatusOr<ExprPtr> ExprParser::ParseUnary(bool with_filter) {
  DepthGuard guard(*this);
  if (auto s = guard.Check(); !s.ok()) return s;
  absl::StatusOr<ExprPtr> node;
  if (in_.IsOp("-") || in_.IsOp("+")) {
    const Token& t = in_.Next();
    auto operand = ParseUnary(false);
    if (!operand.ok()) return operand;
    std::vector<ExprPtr> args;
    args.push_back(std::move(*operand));
    node = Make(t.value == "-" ? ExprKind::kNeg : ExprKind::kPos, t.line, std::move(args));
  } else {
    node = ParsePrimary();
  }
  if (!node.ok()) return node;
  node = ParsePostfix(std::move(*node));
  if (!node.ok() || !with_filter) return node;
  return ParseFilterExpr(std::move(*node));
}

absl::StatusOr<ExprPtr> ExprParser::ParsePrimary() {
  const Token& t = in_.Peek();
  int line = t.line;
  auto literal = [&](Value v) -> absl::StatusOr<ExprPtr> {
    auto made = Make(ExprKind::kLiteral, line, {});
    if (made.ok()) (*made)->literal = std::move(v);
    return made;
  };
  switch (t.type) {
    case TokenType::kName: {
      std::string name = in_.Next().value;
      if (name == "true" || name == "True") return literal(Value::Bool(true));
      if (name == "false" || name == "False") return literal(Value::Bool(false));
      if (name == "none" || name == "None") return literal(Value::None());
      auto made = Make(ExprKind::kName, line, {});
      if (made.ok()) (*made)->name = std::move(name);
      return made;
    }
    case TokenType::kString: {
      std::string s;
      while (in_.Is(TokenType::kString)) s += in_.Next().value;
      return literal(Value::String(std::move(s)));
    }
    case TokenType::kInteger: {
      auto v = ParseIntLiteral(in_.Next().value);
      if (!v.ok()) return in_.Error(t, std::string(v.status().message()));
      return literal(Value::Integer(*v));
    }
    case TokenType::kFloat: {
      std::string text = in_.Next().value;
      std::erase(text, '_');
      return literal(Value::Float(std::strtod(text.c_str(), nullptr)));
    }
    case TokenType::kOperator:
      if (t.value == "(") return ParseParen(line);
      if (t.value == "[") return ParseList(line);
      if (t.value == "{") return ParseDict(line);
      break;
    default:
      break;
  }
  return in_.Error(t, absl::StrCat("unexpected ", TokenCursor::Describe(t)));
}

absl::StatusOr<ExprPtr> ExprParser::ParseParen(int line) {
  in_.Next();
  if (in_.SkipOp(")")) return Make(ExprKind::kTuple, line, {});  // ()
  auto e = ParseTuple(true);
  if (!e.ok()) return e;
  if (auto s = in_.ExpectOp(")"); !s.ok()) return s;
  return e;
}

absl::StatusOr<ExprPtr> ExprParser::ParseList(int line) {
  in_.Next();
  std::vector<ExprPtr> items;
  while (!in_.IsOp("]")) {
    if (!items.empty()) {
      if (auto s = in_.ExpectOp(","); !s.ok()) return s;
      if (in_.IsOp("]")) break;
    }
    auto e = ParseExpression();
    if (!e.ok()) return e;
    items.push_back(std::move(*e));
  }
  in_.Next();
  return Make(ExprKind::kList, line, std::move(items));
}

absl::StatusOr<ExprPtr> ExprParser::ParseDict(int line) {
  in_.Next();
  std::vector<ExprPtr> items;
  while (!in_.IsOp("}")) {
    if (!items.empty()) {
      if (auto s = in_.ExpectOp(","); !s.ok()) return s;
      if (in_.IsOp("}")) break;
    }
    auto key = ParseExpression();
    if (!key.ok()) return key;
    if (auto s = in_.ExpectOp(":"); !s.ok()) return s;
    auto value = ParseExpression();
    if (!value.ok()) return value;
    items.push_back(std::move(*key));
    items.push_back(std::move(*value));
  }
  in_.Next();
  return Make(ExprKind::kDict, line, std::move(items));
}

absl::StatusOr<ExprPtr> ExprParser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (in_.IsOp(".") || in_.IsOp("[")) {
      auto sub = ParseSubscript(std::move(node));
      if (!sub.ok()) return sub;
      node = std::move(*sub);
    } else if (in_.IsOp("(")) {
      int line = in_.Next().line;
      std::vector<ExprPtr> args;
      args.push_back(std::move(node));
      auto call = Make(ExprKind::kCall, line, std::move(args));
      if (!call.ok()) return call;
      if (auto s = ParseCallArgs(**call); !s.ok()) return s;
      node = std::move(*call);
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> ExprParser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    absl::StatusOr<ExprPtr> next;
    if (in_.SkipOp("|")) {
      next = ParseFilter(std::move(node));
    } else if (in_.IsName("is")) {
      next = ParseTest(std::move(node));
    } else if (in_.IsOp("(")) {
      next = ParsePostfix(std::move(node));
    } else {
      return node;
    }
    if (!next.ok()) return next;
    node = std::move(*next);
  }
}

absl::StatusOr<ExprPtr> ExprParser::ParseSubscript(ExprPtr node) {
  const Token& t = in_.Next();
  int line = t.line;
  std::vector<ExprPtr> args;
  args.push_back(std::move(node));
  if (t.value == ".") {
    const Token& attr = in_.Next();
    if (attr.type == TokenType::kName) {
      auto made = Make(ExprKind::kGetAttr, line, std::move(args));
      if (made.ok()) (*made)->name = attr.value;
      return made;
    }
    if (attr.type != TokenType::kInteger) {
      return in_.Error(attr, absl::StrCat("expected a name or number after '.', got ",
                                          TokenCursor::Describe(attr)));
    }
    auto index = ParseIntLiteral(attr.value);
    if (!index.ok()) return in_.Error(attr, std::string(index.status().message()));
    auto lit = Make(ExprKind::kLiteral, line, {});
    if (!lit.ok()) return lit;
    (*lit)->literal = Value::Integer(*index);
    args.push_back(std::move(*lit));
    return Make(ExprKind::kGetItem, line, std::move(args));
  }
  // '[' index ']' or '[' start? ':' stop? (':' step?)? ']'
  ExprPtr bounds[3];
  bool slice = false;
  for (int part = 0; part < 3; ++part) {
    if (!in_.IsOp(":") && !in_.IsOp("]")) {
      auto e = ParseExpression();
      if (!e.ok()) return e;
      bounds[part] = std::move(*e);
    }
    if (part == 2 || !in_.SkipOp(":")) break;
    slice = true;
  }
  if (in_.IsOp(",")) return in_.Error(in_.Peek(), "tuple subscripts are not supported");
  if (auto s = in_.ExpectOp("]"); !s.ok()) return s;
  if (!slice) {
    if (!bounds[0]) return in_.Error(t, "empty subscript");
    args.push_back(std::move(bounds[0]));
    return Make(ExprKind::kGetItem, line, std::move(args));
  }
  for (auto& b : bounds) args.push_back(std::move(b));
  return Make(ExprKind::kSlice, line, std::move(args));
}

absl::Status ExprParser::ParseCallArgs(Expr& call) {
  bool first = true;
  while (!in_.IsOp(")")) {
    if (!first) {
      if (auto s = in_.ExpectOp(","); !s.ok()) return s;
      if (in_.IsOp(")")) break;
    }
    first = false;
    if (in_.IsOp("*") || in_.IsOp("**")) {
      return in_.Error(in_.Peek(), "argument unpacking (*args, **kwargs) is not supported");
    }
    if (in_.Is(TokenType::kName) && in_.IsOp("=", 1)) {
      std::string key = in_.Next().value;
      in_.Next();
      auto value = ParseExpression();
      if (!value.ok()) return value.status();
      call.kwargs.emplace_back(std::move(key), std::move(*value));
      continue;
    }
    if (!call.kwargs.empty()) {
      return in_.Error(in_.Peek(), "positional argument follows keyword argument");
    }
    auto value = ParseExpression();
    if (!value.ok()) return value.status();
    call.args.push_back(std::move(*value));
  }
  in_.Next();
  for (const auto& a : call.args) {
    if (a) call.depth = std::max(call.depth, a->depth + 1);
  }
  for (const auto& [k, v] : call.kwargs) call.depth = std::max(call.depth, v->depth + 1);
  if (call.depth > kMaxExprDepth) return in_.Error(in_.Peek(), "expression nested too deeply");
  return absl::OkStatus();
}

absl::StatusOr<ExprPtr> ExprParser::ParseFilter(ExprPtr subject) {
  do {
    const Token& t = in_.Peek();
    auto name = in_.ExpectName();
    if (!name.ok()) return name.status();
    while (in_.SkipOp(".")) {
      auto part = in_.ExpectName();
      if (!part.ok()) return part.status();
      *name += "." + *part;
    }
    std::vector<ExprPtr> args;
    args.push_back(std::move(subject));
    auto f = Make(ExprKind::kFilter, t.line, std::move(args));
    if (!f.ok()) return f;
    (*f)->name = *name;
    (*f)->filter = FindFilter(*name);
    if ((*f)->filter == nullptr) return in_.Error(t, absl::StrCat("unknown filter '", *name, "'"));
    if (in_.SkipOp("(")) {
      if (auto s = ParseCallArgs(**f); !s.ok()) return s;
    }
    if (auto s = CheckFilterArgs(**f); !s.ok()) return s;
    subject = std::move(*f);
  } while (in_.SkipOp("|"));
  return subject;
}

// select('odd'), selectattr('x', 'equalto', 1), map('upper'): name the unknown test or filter
// when the template loads rather than when the branch first runs.
absl::Status ExprParser::CheckFilterArgs(const Expr& f) {
  size_t index = 0;
  bool is_test = true;
  if (f.name == "select" || f.name == "reject") {
    index = 1;
  } else if (f.name == "selectattr" || f.name == "rejectattr") {
    index = 2;
  } else if (f.name == "map" && f.kwargs.empty()) {
    index = 1;
    is_test = false;
  }
  if (index == 0 || f.args.size() <= index) return absl::OkStatus();
  const Expr& arg = *f.args[index];
  if (arg.kind != ExprKind::kLiteral || !arg.literal.is_string()) return absl::OkStatus();
  const std::string& name = arg.literal.str();
  if (is_test ? FindTest(name) != nullptr : FindFilter(name) != nullptr) return absl::OkStatus();
  return in_.Error(in_.Peek(), absl::StrCat("unknown ", is_test ? "test '" : "filter '", name,
                                            "' in ", f.name, "()"));
}

absl::StatusOr<ExprPtr> ExprParser::ParseTest(ExprPtr node) {
  int line = in_.Next().line;  // 'is'
  bool negated = in_.SkipName("not");
  const Token& t = in_.Peek();
  auto name = in_.ExpectName();
  if (!name.ok()) return name.status();
  std::vector<ExprPtr> args;
  args.push_back(std::move(node));
  auto test = Make(ExprKind::kTest, line, std::move(args));
  if (!test.ok()) return test;
  (*test)->name = *name;
  (*test)->test = FindTest(*name);
  if ((*test)->test == nullptr) return in_.Error(t, absl::StrCat("unknown test '", *name, "'"));
  if (in_.SkipOp("(")) {
    if (auto s = ParseCallArgs(**test); !s.ok()) return s;
  } else if (IsFilterOrTestArgStart(in_.Peek())) {
    if (in_.IsName("is")) return in_.Error(in_.Peek(), "cannot chain tests with 'is'");
    auto arg = ParsePrimary();
    if (!arg.ok()) return arg;
    auto post = ParsePostfix(std::move(*arg));
    if (!post.ok()) return post;
    (*test)->depth = std::max((*test)->depth, (*post)->depth + 1);
    if ((*test)->depth > kMaxExprDepth) return in_.Error(t, "expression nested too deeply");
    (*test)->args.push_back(std::move(*post));
  }
  if (!negated) return test;
  std::vector<ExprPtr> not_args;
  not_args.push_back(std::move(*test));
  return Make(ExprKind::kNot, line, std::move(not_args));
}

}  // namespace tandem::chat
