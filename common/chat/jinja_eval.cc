#include "common/chat/jinja_eval.h"

#include "absl/strings/str_cat.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_ops.h"

namespace tandem::chat {

absl::StatusOr<Value> Evaluator::Eval(const Expr& e, const Scope& scope) {
  if (e.kind == ExprKind::kLiteral) return e.literal;
  if (auto s = state_.EnterFrame(); !s.ok()) return s;
  auto v = EvalInner(e, scope);
  state_.LeaveFrame();
  return v;
}

absl::StatusOr<Value> Evaluator::EvalInner(const Expr& e, const Scope& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName:
      return EvalName(e, scope);
    case ExprKind::kList:
    case ExprKind::kTuple:
    case ExprKind::kDict:
      return EvalContainer(e, scope);
    case ExprKind::kGetAttr:
    case ExprKind::kGetItem:
    case ExprKind::kSlice:
      return EvalAccess(e, scope);
    case ExprKind::kCall:
      return EvalCall(e, scope);
    case ExprKind::kFilter:
    case ExprKind::kTest:
      return EvalFilterOrTest(e, scope);
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      auto v = Eval(*e.args[0], scope);
      if (!v.ok()) return v;
      return UnaryOperation(*v, e.kind == ExprKind::kNeg);
    }
    case ExprKind::kNot: {
      auto v = Eval(*e.args[0], scope);
      if (!v.ok()) return v;
      return Value::Bool(!Truthy(*v));
    }
    case ExprKind::kAnd:
    case ExprKind::kOr:
    case ExprKind::kCondExpr:
      return EvalLogic(e, scope);
    case ExprKind::kBinary: {
      auto a = Eval(*e.args[0], scope);
      if (!a.ok()) return a;
      auto b = Eval(*e.args[1], scope);
      if (!b.ok()) return b;
      return BinaryOperation(e.op, *a, *b, state_);
    }
    case ExprKind::kCompare:
      return EvalCompare(e, scope);
  }
  return absl::InternalError("unknown expression");
}

absl::StatusOr<Value> Evaluator::EvalName(const Expr& e, const Scope& scope) {
  if (const Value* v = scope.Find(e.name)) return *v;
  if (!IsGlobalFunction(e.name)) return Value();
  auto it = globals_.find(e.name);
  if (it != globals_.end()) return it->second;
  auto fn = state_.heap().NewCallable();
  if (!fn.ok()) return fn.status();
  (*fn)->type = Callable::Type::kGlobal;
  (*fn)->name = e.name;
  Value v = Value::CallableOf(*fn);
  globals_.emplace(e.name, v);
  return v;
}

absl::StatusOr<Value> Evaluator::EvalContainer(const Expr& e, const Scope& scope) {
  if (e.kind == ExprKind::kDict) {
    auto dict = state_.heap().NewDict();
    if (!dict.ok()) return dict.status();
    if (auto s = state_.heap().ChargeItems(e.args.size() / 2); !s.ok()) return s;
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      auto k = Eval(*e.args[i], scope);
      if (!k.ok()) return k;
      auto v = Eval(*e.args[i + 1], scope);
      if (!v.ok()) return v;
      if (auto s = (*dict)->Set(*k, std::move(*v)); !s.ok()) return s;
    }
    return Value::DictOf(*dict);
  }
  std::vector<Value> items;
  items.reserve(e.args.size());
  for (const auto& arg : e.args) {
    auto v = Eval(*arg, scope);
    if (!v.ok()) return v;
    items.push_back(std::move(*v));
  }
  return state_.heap().NewSequence(std::move(items), e.kind == ExprKind::kTuple);
}

absl::StatusOr<Value> Evaluator::EvalCompare(const Expr& e, const Scope& scope) {
  auto left = Eval(*e.args[0], scope);
  if (!left.ok()) return left;
  for (size_t i = 0; i < e.compare_ops.size(); ++i) {
    auto right = Eval(*e.args[i + 1], scope);
    if (!right.ok()) return right;
    auto ok = CompareWith(e.compare_ops[i], *left, *right);
    if (!ok.ok()) return ok.status();
    if (!*ok) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Evaluator::EvalLogic(const Expr& e, const Scope& scope) {
  auto first = Eval(*e.args[0], scope);
  if (!first.ok()) return first;
  bool truthy = Truthy(*first);
  switch (e.kind) {
    case ExprKind::kAnd:
      return truthy ? Eval(*e.args[1], scope) : first;
    case ExprKind::kOr:
      return truthy ? first : Eval(*e.args[1], scope);
    default:  // kCondExpr: args = cond, then, else
      if (truthy) return Eval(*e.args[1], scope);
      if (e.args[2]) return Eval(*e.args[2], scope);
      return Value();
  }
}

absl::StatusOr<Value> Evaluator::EvalAccess(const Expr& e, const Scope& scope) {
  auto obj = Eval(*e.args[0], scope);
  if (!obj.ok()) return obj;
  if (e.kind == ExprKind::kGetAttr) return GetAttr(*obj, e.name, state_);
  if (e.kind == ExprKind::kGetItem) {
    auto key = Eval(*e.args[1], scope);
    if (!key.ok()) return key;
    return GetItem(*obj, *key, state_);
  }
  Value bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.args[i + 1]) continue;
    auto b = Eval(*e.args[i + 1], scope);
    if (!b.ok()) return b;
    bounds[i] = std::move(*b);
  }
  return Slice(*obj, bounds[0], bounds[1], bounds[2], state_);
}

absl::StatusOr<CallArgs> Evaluator::EvalArgs(const Expr& e, size_t first, const Scope& scope) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    auto v = Eval(*e.args[i], scope);
    if (!v.ok()) return v.status();
    args.positional.push_back(std::move(*v));
  }
  for (const auto& [name, expr] : e.kwargs) {
    auto v = Eval(*expr, scope);
    if (!v.ok()) return v.status();
    args.keyword.emplace_back(name, std::move(*v));
  }
  return args;
}

absl::StatusOr<Value> Evaluator::EvalCallee(const Expr& callee, const Scope& scope,
                                            std::string* what) {
  if (callee.kind == ExprKind::kGetAttr) {
    auto obj = Eval(*callee.args[0], scope);
    if (!obj.ok()) return obj;
    *what = absl::StrCat("'", TypeName(*obj), " object' has no attribute '", callee.name, "'");
    return GetAttr(*obj, callee.name, state_);
  }
  *what = callee.kind == ExprKind::kName ? absl::StrCat("'", callee.name, "' is undefined")
                                         : "called an undefined value";
  return Eval(callee, scope);
}

absl::StatusOr<Value> Evaluator::EvalCall(const Expr& e, const Scope& scope) {
  const Expr& target = *e.args[0];
  if (target.kind == ExprKind::kGetAttr) {
    // obj.method(...): call it directly instead of making a bound method first. Methods win
    // over dict keys of the same name, as Python's getattr does.
    auto obj = Eval(*target.args[0], scope);
    if (!obj.ok()) return obj;
    if (HasMethod(*obj, target.name)) {
      auto args = EvalArgs(e, 1, scope);
      if (!args.ok()) return args.status();
      return CallMethod(*obj, target.name, *args, state_);
    }
    auto callee = GetAttr(*obj, target.name, state_);
    if (!callee.ok()) return callee;
    auto args = EvalArgs(e, 1, scope);
    if (!args.ok()) return args.status();
    return Call(*callee, *args, Value(),
                absl::StrCat("'", TypeName(*obj), " object' has no attribute '", target.name, "'"));
  }
  std::string what;
  auto callee = EvalCallee(*e.args[0], scope, &what);
  if (!callee.ok()) return callee;
  auto args = EvalArgs(e, 1, scope);
  if (!args.ok()) return args.status();
  return Call(*callee, *args, Value(), what);
}

absl::StatusOr<Value> Evaluator::Call(const Value& callee, const CallArgs& args,
                                      const Value& caller, std::string_view undefined_error) {
  if (callee.is_undefined()) return absl::InvalidArgumentError(std::string(undefined_error));
  if (!callee.is_callable()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }
  const Callable& fn = *callee.callable();
  switch (fn.type) {
    case Callable::Type::kMacro:
    case Callable::Type::kCaller:
      return macros_.InvokeMacro(fn, args, caller);
    case Callable::Type::kGlobal:
      if (!caller.is_undefined()) break;
      return CallGlobal(fn.name, args, state_);
    case Callable::Type::kMethod:
      if (!caller.is_undefined()) break;
      return CallMethod(fn.receiver, fn.name, args, state_);
  }
  return absl::InvalidArgumentError("'{% call %}' needs a macro");
}

absl::StatusOr<Value> Evaluator::EvalFilterOrTest(const Expr& e, const Scope& scope) {
  if (!e.args[0]) return absl::InternalError("filter without input");
  auto input = Eval(*e.args[0], scope);
  if (!input.ok()) return input;
  auto args = EvalArgs(e, 1, scope);
  if (!args.ok()) return args.status();
  if (e.kind == ExprKind::kFilter) return e.filter(*input, *args, state_);
  auto result = e.test(*input, *args, state_);
  if (!result.ok()) return result.status();
  return Value::Bool(*result);
}

absl::StatusOr<Value> Evaluator::ApplyFilterChain(const Expr& chain, const Value& input,
                                                  const Scope& scope) {
  Value subject = input;
  if (chain.args[0]) {
    auto inner = ApplyFilterChain(*chain.args[0], input, scope);
    if (!inner.ok()) return inner;
    subject = std::move(*inner);
  }
  auto args = EvalArgs(chain, 1, scope);
  if (!args.ok()) return args.status();
  return chain.filter(subject, *args, state_);
}

}  // namespace tandem::chat
