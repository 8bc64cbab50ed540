#include "common/chat/jinja_parser.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_lexer.h"

namespace tandem::chat {

absl::StatusOr<StmtList> Parser::Parse(std::string_view source, const std::string& name) {
  auto tokens = LexTemplate(source, name);
  if (!tokens.ok()) return tokens.status();
  Parser parser(*tokens, name);
  auto body = parser.ParseBody({});
  if (!body.ok()) return body.status();
  if (!parser.in_.Is(TokenType::kEof)) {
    return parser.in_.Error(parser.in_.Peek(), "unexpected input after the template");
  }
  return body;
}

absl::Status Parser::ExpectBlockEnd() {
  if (in_.Is(TokenType::kBlockEnd)) {
    in_.Next();
    return absl::OkStatus();
  }
  return in_.Error(in_.Peek(), absl::StrCat("expected end of tag '%}', got ",
                                            TokenCursor::Describe(in_.Peek())));
}

absl::StatusOr<StmtList> Parser::ParseBody(const std::vector<std::string_view>& end_tags) {
  StmtList out;
  while (true) {
    const Token& t = in_.Peek();
    switch (t.type) {
      case TokenType::kEof:
        return out;
      case TokenType::kText: {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = StmtKind::kText;
        stmt->line = t.line;
        stmt->text = in_.Next().value;
        out.push_back(std::move(stmt));
        break;
      }
      case TokenType::kVarBegin: {
        in_.Next();
        auto e = expr_.ParseTuple();
        if (!e.ok()) return e.status();
        if (!in_.Is(TokenType::kVarEnd)) {
          return in_.Error(in_.Peek(), absl::StrCat("expected end of output '}}', got ",
                                                    TokenCursor::Describe(in_.Peek())));
        }
        in_.Next();
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = StmtKind::kOutput;
        stmt->line = t.line;
        stmt->expr = std::move(*e);
        out.push_back(std::move(stmt));
        break;
      }
      case TokenType::kBlockBegin: {
        const Token& tag = in_.Peek(1);
        if (tag.type == TokenType::kName &&
            std::find(end_tags.begin(), end_tags.end(), tag.value) != end_tags.end()) {
          return out;
        }
        auto stmt = ParseTag();
        if (!stmt.ok()) return stmt.status();
        out.push_back(std::move(*stmt));
        break;
      }
      default:
        return in_.Error(t, absl::StrCat("unexpected ", TokenCursor::Describe(t)));
    }
  }
}

absl::StatusOr<StmtPtr> Parser::ParseTag() {
  in_.Next();  // {%
  const Token& t = in_.Peek();
  if (t.type != TokenType::kName) {
    return in_.Error(t, absl::StrCat("expected a tag name, got ", TokenCursor::Describe(t)));
  }
  std::string tag = in_.Next().value;
  int line = t.line;
  if (tag == "for") return ParseFor(line);
  if (tag == "if") return ParseIf(line);
  if (tag == "set") return ParseSet(line);
  if (tag == "macro") return ParseMacro(line);
  if (tag == "call") return ParseCallBlock(line);
  if (tag == "filter") return ParseFilterBlock(line);
  if (tag == "generation") return ParseSimpleBlock(StmtKind::kGeneration, line, "endgeneration");
  if (tag == "break" || tag == "continue") {
    if (loop_nesting_ == 0) return in_.Error(t, absl::StrCat("'", tag, "' outside of a loop"));
    if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    stmt->line = line;
    return stmt;
  }
  static constexpr std::string_view kStray[] = {"elif",   "else",         "endif",   "endfor",
                                                "endset", "endmacro",     "endcall", "endfilter",
                                                "endraw", "endgeneration"};
  for (std::string_view stray : kStray) {
    if (tag == stray) return in_.Error(t, absl::StrCat("unexpected '", tag, "' tag"));
  }
  return in_.Error(t, absl::StrCat("unsupported tag '", tag, "'"));
}

absl::StatusOr<StmtList> Parser::ParseBlockBody(std::string_view end_tag, int open_line,
                                                std::string_view open_tag) {
  if (++block_nesting_ > kMaxBlockNesting) {
    return in_.Error(in_.Peek(), "blocks nested too deeply");
  }
  auto body = ParseBody({end_tag});
  if (!body.ok()) return body;
  if (in_.Is(TokenType::kEof)) {
    return in_.Error(in_.Peek(), absl::StrCat("unexpected end of template: '{% ",
                                              std::string(open_tag), " %}' on line ", open_line,
                                              " needs '{% ", std::string(end_tag), " %}'"));
  }
  in_.Next();  // {%
  in_.Next();  // end tag name
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  --block_nesting_;
  return body;
}

absl::StatusOr<Target> Parser::ParseTarget(bool allow_attr) {
  Target target;
  bool paren = in_.SkipOp("(");
  auto name = in_.ExpectName();
  if (!name.ok()) return name.status();
  target.names.push_back(*name);
  if (!paren && allow_attr && in_.SkipOp(".")) {
    auto attr = in_.ExpectName();
    if (!attr.ok()) return attr.status();
    target.attr = *attr;
    return target;
  }
  while (in_.SkipOp(",")) {
    if (paren && in_.IsOp(")")) break;
    auto next = in_.ExpectName();
    if (!next.ok()) return next.status();
    target.names.push_back(*next);
    target.unpack = true;
  }
  if (paren) {
    target.unpack = true;
    if (auto s = in_.ExpectOp(")"); !s.ok()) return s;
  }
  return target;
}

absl::StatusOr<StmtPtr> Parser::ParseFor(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kFor;
  stmt->line = line;
  auto target = ParseTarget(false);
  if (!target.ok()) return target.status();
  stmt->target = std::move(*target);
  if (!in_.SkipName("in")) return in_.Error(in_.Peek(), "expected 'in' in for loop");
  auto iter = expr_.ParseTuple(/*with_condexpr=*/false);
  if (!iter.ok()) return iter.status();
  stmt->expr = std::move(*iter);
  if (in_.SkipName("if")) {
    auto cond = expr_.ParseExpression();
    if (!cond.ok()) return cond.status();
    stmt->cond = std::move(*cond);
  }
  if (in_.IsName("recursive")) {
    return in_.Error(in_.Peek(), "unsupported construct 'recursive' loop");
  }
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  if (++block_nesting_ > kMaxBlockNesting) return in_.Error(in_.Peek(), "blocks nested too deeply");
  ++loop_nesting_;
  auto body = ParseBody({"endfor", "else"});
  --loop_nesting_;
  --block_nesting_;
  if (!body.ok()) return body.status();
  stmt->body = std::move(*body);
  if (in_.IsName("else", 1)) {
    in_.Next();
    in_.Next();
    if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    auto else_body = ParseBlockBody("endfor", line, "for");
    if (!else_body.ok()) return else_body.status();
    stmt->else_body = std::move(*else_body);
    return stmt;
  }
  auto rest = ParseBlockBody("endfor", line, "for");  // empty: the body stopped at endfor
  if (!rest.ok()) return rest.status();
  return stmt;
}

absl::StatusOr<StmtPtr> Parser::ParseIf(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kIf;
  stmt->line = line;
  if (++block_nesting_ > kMaxBlockNesting) return in_.Error(in_.Peek(), "blocks nested too deeply");
  bool has_else = false;
  while (true) {
    IfBranch branch;
    if (!has_else) {
      auto cond = expr_.ParseTuple(/*with_condexpr=*/false);
      if (!cond.ok()) return cond.status();
      branch.cond = std::move(*cond);
    }
    if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    auto body = has_else ? ParseBody({"endif"}) : ParseBody({"elif", "else", "endif"});
    if (!body.ok()) return body.status();
    branch.body = std::move(*body);
    stmt->branches.push_back(std::move(branch));
    if (in_.Is(TokenType::kEof)) {
      return in_.Error(in_.Peek(), absl::StrCat("unexpected end of template: '{% if %}' on line ",
                                                line, " needs '{% endif %}'"));
    }
    in_.Next();  // {%
    std::string tag = in_.Next().value;
    if (tag == "endif") break;
    has_else = tag == "else";
  }
  --block_nesting_;
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  return stmt;
}

absl::StatusOr<StmtPtr> Parser::ParseSet(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->line = line;
  auto target = ParseTarget(true);
  if (!target.ok()) return target.status();
  stmt->target = std::move(*target);
  if (in_.SkipOp("=")) {
    stmt->kind = StmtKind::kSet;
    auto value = expr_.ParseTuple();
    if (!value.ok()) return value.status();
    stmt->expr = std::move(*value);
    if (auto s = ExpectBlockEnd(); !s.ok()) return s;
    return stmt;
  }
  stmt->kind = StmtKind::kSetBlock;
  if (stmt->target.unpack) return in_.Error(in_.Peek(), "a block set needs a single target");
  if (in_.SkipOp("|")) {
    auto chain = expr_.ParseFilter(nullptr);
    if (!chain.ok()) return chain.status();
    stmt->expr = std::move(*chain);
  }
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  auto body = ParseBlockBody("endset", line, "set");
  if (!body.ok()) return body.status();
  stmt->body = std::move(*body);
  return stmt;
}

absl::Status Parser::ParseParams(Stmt& stmt) {
  while (!in_.SkipOp(")")) {
    if (!stmt.params.empty()) {
      if (auto s = in_.ExpectOp(","); !s.ok()) return s;
      if (in_.SkipOp(")")) break;
    }
    auto name = in_.ExpectName();
    if (!name.ok()) return name.status();
    ExprPtr def;
    if (in_.SkipOp("=")) {
      auto e = expr_.ParseExpression();
      if (!e.ok()) return e.status();
      def = std::move(*e);
    } else if (!stmt.defaults.empty() && stmt.defaults.back()) {
      return in_.Error(in_.Peek(), "non-default argument follows default argument");
    }
    stmt.params.push_back(*name);
    stmt.defaults.push_back(std::move(def));
  }
  return absl::OkStatus();
}

absl::StatusOr<StmtPtr> Parser::ParseMacro(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kMacro;
  stmt->line = line;
  auto name = in_.ExpectName();
  if (!name.ok()) return name.status();
  stmt->name = *name;
  if (auto s = in_.ExpectOp("("); !s.ok()) return s;
  if (auto s = ParseParams(*stmt); !s.ok()) return s;
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  int saved_loops = loop_nesting_;
  loop_nesting_ = 0;
  auto body = ParseBlockBody("endmacro", line, "macro");
  loop_nesting_ = saved_loops;
  if (!body.ok()) return body.status();
  stmt->body = std::move(*body);
  return stmt;
}

absl::StatusOr<StmtPtr> Parser::ParseCallBlock(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kCallBlock;
  stmt->line = line;
  stmt->name = "caller";
  if (in_.SkipOp("(")) {
    if (auto s = ParseParams(*stmt); !s.ok()) return s;
  }
  auto call = expr_.ParseExpression();
  if (!call.ok()) return call.status();
  if ((*call)->kind != ExprKind::kCall) {
    return in_.Error(in_.Peek(), "'{% call %}' needs a macro call");
  }
  stmt->expr = std::move(*call);
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  int saved_loops = loop_nesting_;
  loop_nesting_ = 0;
  auto body = ParseBlockBody("endcall", line, "call");
  loop_nesting_ = saved_loops;
  if (!body.ok()) return body.status();
  stmt->body = std::move(*body);
  return stmt;
}

absl::StatusOr<StmtPtr> Parser::ParseFilterBlock(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kFilterBlock;
  stmt->line = line;
  auto chain = expr_.ParseFilter(nullptr);
  if (!chain.ok()) return chain.status();
  stmt->expr = std::move(*chain);
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  auto body = ParseBlockBody("endfilter", line, "filter");
  if (!body.ok()) return body.status();
  stmt->body = std::move(*body);
  return stmt;
}

absl::StatusOr<StmtPtr> Parser::ParseSimpleBlock(StmtKind kind, int line,
                                                 std::string_view end_tag) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = kind;
  stmt->line = line;
  if (auto s = ExpectBlockEnd(); !s.ok()) return s;
  auto body = ParseBlockBody(end_tag, line, "generation");
  if (!body.ok()) return body.status();
  stmt->body = std::move(*body);
  return stmt;
}

}  // namespace tandem::chat
