#include "common/chat/jinja_renderer.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_ops.h"

namespace tandem::chat {
namespace {
constexpr char kAnnotatedUrl[] = "tandem.chat/annotated";

// Leaves the frame counted by EnterFrame when the statement ends.
class FrameGuard {
 public:
  explicit FrameGuard(RenderState& state) : state_(state), status_(state.EnterFrame()) {}
  ~FrameGuard() {
    if (status_.ok()) state_.LeaveFrame();
  }
  const absl::Status& status() const { return status_; }

 private:
  RenderState& state_;
  absl::Status status_;
};
}  // namespace

absl::Status Renderer::Annotate(absl::Status status, int line) const {
  if (status.ok() || IsTemplateRaised(status) || status.GetPayload(kAnnotatedUrl).has_value()) {
    return status;
  }
  absl::Status out(status.code(), absl::StrCat(name_, " line ", line, ": ", status.message()));
  out.SetPayload(kAnnotatedUrl, absl::Cord("1"));
  return out;
}

absl::StatusOr<std::string> Renderer::Render(const StmtList& body, Scope& root) {
  std::string out;
  root_ = &root;
  out_ = &out;
  auto flow = ExecBody(body, root);
  out_ = nullptr;
  if (!flow.ok()) return flow.status();
  return out;
}

absl::StatusOr<Renderer::Flow> Renderer::ExecBody(const StmtList& body, Scope& scope) {
  for (const StmtPtr& stmt : body) {
    auto flow = Exec(*stmt, scope);
    if (!flow.ok() || *flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Renderer::Flow> Renderer::Exec(const Stmt& stmt, Scope& scope) {
  FrameGuard frame(state_);
  if (!frame.status().ok()) return Annotate(frame.status(), stmt.line);
  absl::Status status;
  switch (stmt.kind) {
    case StmtKind::kText:
      status = EmitText(stmt.text);
      break;
    case StmtKind::kOutput: {
      auto v = eval_.Eval(*stmt.expr, scope);
      status = v.ok() ? Emit(*v) : v.status();
      break;
    }
    case StmtKind::kIf:
      return ExecIf(stmt, scope);
    case StmtKind::kFor:
      return ExecFor(stmt, scope);
    case StmtKind::kSet:
      status = ExecSet(stmt, scope);
      break;
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock:
      status = ExecBlock(stmt, scope);
      break;
    case StmtKind::kMacro: {
      auto fn = state_.heap().NewCallable();
      if (!fn.ok()) return Annotate(fn.status(), stmt.line);
      (*fn)->type = Callable::Type::kMacro;
      (*fn)->name = stmt.name;
      (*fn)->def = &stmt;
      scope.Set(stmt.name, Value::CallableOf(*fn));
      break;
    }
    case StmtKind::kCallBlock:
      status = ExecCallBlock(stmt, scope);
      break;
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kGeneration:
      return ExecBody(stmt.body, scope);
  }
  if (!status.ok()) return Annotate(status, stmt.line);
  return Flow::kNormal;
}

absl::StatusOr<Renderer::Flow> Renderer::ExecIf(const Stmt& stmt, Scope& scope) {
  for (const IfBranch& branch : stmt.branches) {
    if (branch.cond) {
      auto cond = eval_.Eval(*branch.cond, scope);
      if (!cond.ok()) return Annotate(cond.status(), branch.cond->line);
      if (!Truthy(*cond)) continue;
    }
    return ExecBody(branch.body, scope);
  }
  return Flow::kNormal;
}

absl::StatusOr<Renderer::Flow> Renderer::ExecFor(const Stmt& stmt, Scope& scope) {
  auto iterable = eval_.Eval(*stmt.expr, scope);
  if (!iterable.ok()) return Annotate(iterable.status(), stmt.line);
  auto items = Iterate(*iterable, state_);
  if (!items.ok()) return Annotate(items.status(), stmt.line);
  auto loop = state_.heap().NewLoop();
  if (!loop.ok()) return Annotate(loop.status(), stmt.line);
  if (stmt.cond) {
    for (Value& item : *items) {
      if (auto s = state_.CountIteration(); !s.ok()) return Annotate(s, stmt.line);
      Scope probe(&scope);
      if (auto s = Assign(stmt.target, item, probe); !s.ok()) return Annotate(s, stmt.line);
      auto keep = eval_.Eval(*stmt.cond, probe);
      if (!keep.ok()) return Annotate(keep.status(), stmt.line);
      if (Truthy(*keep)) (*loop)->items.push_back(std::move(item));
    }
  } else {
    (*loop)->items = std::move(*items);
  }
  LoopState& loop_state = **loop;
  if (loop_state.items.empty()) return ExecBody(stmt.else_body, scope);
  for (size_t i = 0; i < loop_state.items.size(); ++i) {
    if (auto s = state_.CountIteration(); !s.ok()) return Annotate(s, stmt.line);
    Scope iteration(&scope);
    loop_state.index0 = i;
    if (auto s = Assign(stmt.target, loop_state.items[i], iteration); !s.ok()) {
      return Annotate(s, stmt.line);
    }
    iteration.Set("loop", Value::LoopOf(&loop_state));
    auto flow = ExecBody(stmt.body, iteration);
    if (!flow.ok()) return flow;
    if (*flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

absl::Status Renderer::Assign(const Target& target, const Value& value, Scope& scope) {
  if (!target.attr.empty()) {
    const Value* ns = scope.Find(target.names[0]);
    if (ns == nullptr || !ns->is_namespace()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot assign attribute '", target.attr,
                                                     "' on non-namespace '", target.names[0], "'"));
    }
    if (auto s = state_.heap().ChargeItems(1); !s.ok()) return s;
    ns->dict()->SetString(target.attr, value);
    return absl::OkStatus();
  }
  if (!target.unpack) {
    scope.Set(target.names[0], value);
    return absl::OkStatus();
  }
  auto items = Iterate(value, state_);
  if (!items.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot unpack non-iterable ", TypeName(value), " object"));
  }
  size_t want = target.names.size();
  if (items->size() != want) {
    return absl::InvalidArgumentError(
        items->size() > want ? absl::StrCat("too many values to unpack (expected ", want, ")")
                             : absl::StrCat("not enough values to unpack (expected ", want,
                                            ", got ", items->size(), ")"));
  }
  for (size_t i = 0; i < want; ++i) scope.Set(target.names[i], (*items)[i]);
  return absl::OkStatus();
}

absl::Status Renderer::ExecSet(const Stmt& stmt, Scope& scope) {
  auto v = eval_.Eval(*stmt.expr, scope);
  if (!v.ok()) return v.status();
  return Assign(stmt.target, *v, scope);
}

absl::Status Renderer::ExecBlock(const Stmt& stmt, Scope& scope) {
  auto text = Capture(stmt.body, scope);
  if (!text.ok()) return text.status();
  auto v = state_.heap().NewString(std::move(*text));
  if (!v.ok()) return v.status();
  if (stmt.expr) {
    v = eval_.ApplyFilterChain(*stmt.expr, *v, scope);
    if (!v.ok()) return v.status();
  }
  if (stmt.kind == StmtKind::kSetBlock) return Assign(stmt.target, *v, scope);
  return Emit(*v);
}

absl::Status Renderer::ExecCallBlock(const Stmt& stmt, Scope& scope) {
  auto caller = state_.heap().NewCallable();
  if (!caller.ok()) return caller.status();
  Callable& fn = **caller;
  fn.type = Callable::Type::kCaller;
  fn.name = "caller";
  fn.def = &stmt;
  fn.closure = &scope;
  std::string what;
  auto callee = eval_.EvalCallee(*stmt.expr->args[0], scope, &what);
  if (!callee.ok()) return callee.status();
  auto args = eval_.EvalArgs(*stmt.expr, 1, scope);
  if (!args.ok()) return args.status();
  auto result = eval_.Call(*callee, *args, Value::CallableOf(&fn), what);
  fn.live = false;  // the scope it closes over ends with this statement
  if (!result.ok()) return result.status();
  return Emit(*result);
}

absl::Status Renderer::BindParams(const Stmt& def, const std::string& name, const CallArgs& args,
                                  Scope& scope) {
  size_t n = def.params.size();
  if (args.positional.size() > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("macro '", name, "' takes not more than ", n, " argument(s)"));
  }
  std::vector<const Value*> bound(n, nullptr);
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < n && def.params[i] != key) ++i;
    if (i == n) {
      return absl::InvalidArgumentError(
          absl::StrCat("macro '", name, "' takes no keyword argument '", key, "'"));
    }
    if (bound[i] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("macro '", name, "' got multiple values for argument '", key, "'"));
    }
    bound[i] = &value;
  }
  for (size_t i = 0; i < n; ++i) {
    if (bound[i] != nullptr) {
      scope.Set(def.params[i], *bound[i]);
    } else if (def.defaults[i]) {
      auto v = eval_.Eval(*def.defaults[i], scope);
      if (!v.ok()) return v.status();
      scope.Set(def.params[i], *v);
    } else {
      scope.Set(def.params[i], Value());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::InvokeMacro(const Callable& fn, const CallArgs& args,
                                            const Value& caller) {
  if (fn.type == Callable::Type::kCaller && !fn.live) {
    return absl::InvalidArgumentError("caller() used after its {% call %} block ended");
  }
  if (auto s = state_.EnterMacro(); !s.ok()) return s;
  Scope scope(fn.type == Callable::Type::kCaller ? fn.closure : root_);
  absl::StatusOr<std::string> text;
  if (absl::Status bound = BindParams(*fn.def, fn.name, args, scope); bound.ok()) {
    if (!caller.is_undefined()) scope.Set("caller", caller);
    text = Capture(fn.def->body, scope);
  } else {
    text = bound;
  }
  state_.LeaveMacro();
  if (!text.ok()) return text.status();
  return state_.heap().NewString(std::move(*text));
}

absl::StatusOr<std::string> Renderer::Capture(const StmtList& body, Scope& scope) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  auto flow = ExecBody(body, scope);
  out_ = saved;
  if (!flow.ok()) return flow.status();
  return buffer;
}

absl::Status Renderer::EmitText(const std::string& text) {
  if (text.size() > state_.limits().max_output_bytes - out_->size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendered output exceeds ", state_.limits().max_output_bytes, " bytes"));
  }
  out_->append(text);
  return absl::OkStatus();
}

absl::Status Renderer::Emit(const Value& v) {
  if (v.is_string()) return EmitText(v.str());
  if (auto s = AppendStr(v, state_.format(), out_); !s.ok()) return s;
  if (out_->size() > state_.limits().max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendered output exceeds ", state_.limits().max_output_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::chat
